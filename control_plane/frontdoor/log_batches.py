"""Log shipments written together (frontdoor/group_commit.py): the lines of the shipments that
arrive while the previous batch is being written go in one statement and one commit. The writer
calls the operation every shipment ends in (`services.logs.post_many`), which checks each
shipment on its own (its caller, its rights, its lines)."""

from __future__ import annotations

from control_plane.frontdoor.group_commit import GroupWriter
from control_plane.frontdoor.per_master import per_master
from control_plane.master import Master
from control_plane.services import logs as log_records


class LogBatches(GroupWriter[log_records.Shipment]):
    name = "logs"

    def __init__(self, master: Master) -> None:
        super().__init__(master, log_records.post_many)


of = per_master(LogBatches)
