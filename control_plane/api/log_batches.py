"""Log shipments written together (api/group_commit.py): the lines of the shipments that arrive
while the previous batch is being written go in one statement and one commit. Each shipment is
checked on its own (`services.logs.post_many`: its caller, its rights, its lines)."""

from __future__ import annotations

from control_plane.api.group_commit import GroupWriter
from control_plane.api.per_master import per_master
from control_plane.master import Master
from control_plane.services import logs as log_records


class LogBatches(GroupWriter[log_records.Shipment]):
    name = "logs"

    def __init__(self, master: Master) -> None:
        super().__init__(master, log_records.post_many)


of = per_master(LogBatches)
