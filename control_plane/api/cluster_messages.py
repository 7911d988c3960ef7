"""`/api/v1/master/cluster_message` (Determined's GetClusterMessage / SetClusterMessage /
DeleteClusterMessage: `det master cluster-message get / set / clear`). Setting and clearing are an
admin's; reading is any signed-in user's (Determined asks for an admin there too; the message is
shown to everyone in its web UI, as here: ui/)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import Field
from sqlalchemy.orm import Session

from control_plane.api import deps, serializers
from control_plane.api.wire import ProtoWire, ts
from control_plane.auth import Principal
from control_plane.db.models import ClusterMessage
from control_plane.master import Master
from control_plane.services import cluster_messages

router = APIRouter()


def message_json(m: ClusterMessage) -> dict[str, Any]:
    """Determined's v1ClusterMessage."""
    out = {"message": m.message, "startTime": ts(m.start_time), "createdTime": ts(m.created_time)}
    if m.end_time is not None:  # absent when indefinite, as grpc-gateway leaves an unset timestamp
        out["endTime"] = ts(m.end_time)
    return out


@router.get("/api/v1/master/cluster_message")
def get_cluster_message(_p: Principal = Depends(deps.user), master: Master = Depends(deps.get_master),
                        db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    """The cluster's message (the newest that has not ended; it may not have started), or none."""
    m = cluster_messages.current(db, master.clock())
    return {"clusterMessage": message_json(m)} if m is not None else {}


class SetClusterMessageRequest(ProtoWire):
    message: str = Field(max_length=100_000)  # the 250-character rule is the service's, with its reason
    start_time: str | None = None
    end_time: str | None = None
    duration: str | None = Field(default=None, max_length=100)


@router.put("/api/v1/master/cluster_message")
def set_cluster_message(body: SetClusterMessageRequest, p: Principal = Depends(deps.admin),
                        master: Master = Depends(deps.get_master),
                        db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    cluster_messages.set_message(db, master, p, body.message, serializers.parse_time(body.start_time, "startTime"),
                                 serializers.parse_time(body.end_time, "endTime"), body.duration)
    return {}


@router.delete("/api/v1/master/cluster_message")
def delete_cluster_message(p: Principal = Depends(deps.admin), master: Master = Depends(deps.get_master),
                           db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    cluster_messages.clear(db, master, p)
    return {}
