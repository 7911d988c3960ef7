"""Single metric reports written together (frontdoor/group_commit.py): the reports that arrive
while the previous batch is being written are stored with one commit, those of one trial by one
upsert. The writer calls the operation every report ends in (`services.metrics.report_many`),
which checks each request on its own (its caller, its right to report for the trial, its
reports). A trial's `…/metrics/batch` goes on its own, as sent: it is a batch already, stored all
or nothing."""

from __future__ import annotations

from control_plane.frontdoor.group_commit import GroupWriter
from control_plane.frontdoor.per_master import per_master
from control_plane.master import Master
from control_plane.services import metrics as trial_metrics


class MetricBatches(GroupWriter[trial_metrics.Report]):
    name = "metrics"

    def __init__(self, master: Master) -> None:
        super().__init__(master, trial_metrics.report_many)


of = per_master(MetricBatches)
