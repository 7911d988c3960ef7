"""The cluster-wide message (Determined's `det master cluster-message set / get / clear`), kept in
`cluster_messages`; the rules are core/cluster_message.py. Setting and clearing are an admin's
(checked by the API's `deps.admin`); reading is any signed-in user's."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from control_plane.auth import Principal
from control_plane.core import cluster_message as rules
from control_plane.db.models import ClusterMessage
from control_plane.errors import FieldProblem, Invalid
from control_plane.master import Master
from control_plane.services.text import clean_text

log = logging.getLogger("shipyard.cluster_message")


def current(s: Session, now: datetime) -> ClusterMessage | None:
    """The cluster's message: the newest row, unless it has ended."""
    newest = s.scalar(select(ClusterMessage).order_by(ClusterMessage.created_time.desc(), ClusterMessage.id.desc())
                      .limit(1))
    return newest if newest is not None and rules.current(newest.end_time, now) else None


def shown(s: Session, now: datetime) -> ClusterMessage | None:
    """The message to show now (the web UI's banner): the current one, once it has started."""
    m = current(s, now)
    return m if m is not None and rules.shown(m.start_time, m.end_time, now) else None


def _expire(s: Session, now: datetime) -> int:
    rows = list(s.scalars(select(ClusterMessage).where(
        or_(ClusterMessage.end_time.is_(None), ClusterMessage.end_time >= now)).with_for_update()))
    for row in rows:
        row.end_time = now
    return len(rows)


def set_message(s: Session, master: Master, by: Principal, message: str, start: datetime | None,
                end: datetime | None, duration: str | None) -> ClusterMessage:
    """Expire the current message and add this one (start: now when not given); a 400 naming the
    field for a message over 250 characters, an end before the start or now, a bad duration, or
    both end and duration."""
    now = master.clock()
    start = start or now
    end, problems = rules.checked_window(message, start, end, duration, now)
    if problems:
        raise Invalid("; ".join(f"{p.field}: {p.reason}" for p in problems),
                      [FieldProblem(p.field, p.reason) for p in problems])
    _expire(s, now)
    row = ClusterMessage(created_by=by.user_id, message=clean_text(message), start_time=start, end_time=end,
                         created_time=now)
    s.add(row)
    s.flush()
    log.info("event=cluster_message_set by=%s start=%s end=%s", by.username, start.isoformat(),
             end.isoformat() if end else "")
    return row


def clear(s: Session, master: Master, by: Principal) -> None:
    expired = _expire(s, master.clock())
    log.info("event=cluster_message_cleared by=%s expired=%d", by.username, expired)
