"""How the router tells the workers of a START: a hint on the queue or, where the queue is
out of reach, a worker named through the table. The free scan would find it too, but it
slows down while it finds nothing (up to RECONCILE_BACKOFF_CAP x RECONCILE_SECONDS), and a
worker learns the queue is down only when a poll fails, which a long poll already waiting
does not. The move is a drain's (:meth:`wsfleet.store.ConnectionsStore.move`: attached at
the next fence and posted to the session's inbox in one transaction), picked up at the
worker's next renewal; if it fails too, the free scan is still there."""

from __future__ import annotations

import json
import time
from typing import Any

from . import schema, tracing
from .balance import FleetLoad
from .logs import JsonLogger
from .store.moves import Moved

CANDIDATES = 3  # sessions tried at most


def tell_workers(
    sqs: Any, queue_url: str, connections: Any, sessions: Any, connection_id: str, fence_token: int, log: JsonLogger
) -> dict[str, Any]:
    """A START stored, unowned: hint it, or else move it (:func:`assign_unhinted`). Returns
    the request log's fields: ``hint_sent``, and ``assigned_to`` (a session, or "") when not."""
    trace_header = tracing.current_header()  # the taker's acquire continues this trace
    try:
        body = json.dumps({schema.HINT_CONNECTION_ID: connection_id})
        sqs.send_message(QueueUrl=queue_url, MessageBody=body, **schema.hint_trace_attributes(trace_header))
        return {"hint_sent": True}
    except Exception as exc:  # noqa: BLE001 - any failure: the table's way next
        log.warning("start_hint_failed", connection_id=connection_id, detail=f"{type(exc).__name__}: {exc}")
    try:
        to = assign_unhinted(connections, sessions, connection_id, fence_token, now_ms=int(time.time() * 1000))
    except Exception as exc:  # noqa: BLE001 - the free scan finds it
        log.warning("start_assign_failed", connection_id=connection_id, detail=f"{type(exc).__name__}: {exc}")
        to = ""
    return {"hint_sent": False, "assigned_to": to}


def assign_unhinted(connections: Any, sessions: Any, connection_id: str, fence_token: int, *, now_ms: int) -> str:
    """Move the connection (unowned, at ``fence_token``) to the fleet summary's session most
    under its share (or, where it lists every load, with the most room) that is LIVE and
    renewed within half its lease (not one died since). Returns the session, or "" (no
    fresh summary or candidate, refused, or taken meanwhile: the free scan's)."""
    item = sessions.get(schema.FLEET_SUMMARY_ID, consistent=False)
    fleet = FleetLoad.from_item(item) if item else None
    if fleet is None or not fleet.fresh_at(now_ms):
        return ""
    ranked = sorted(fleet.under, key=lambda s: (-fleet.under[s], s))
    if not ranked:
        room = {s: cap - held for s, (held, cap) in fleet.loads.items() if held < cap}
        ranked = sorted(room, key=lambda s: (-room[s], s))
    for session_id in ranked[:CANDIDATES]:
        session = sessions.get(session_id, consistent=False)
        if session is None or not renewed_lately(session, now_ms):
            continue
        moved = connections.move(connection_id, from_session="", fence_token=fence_token, to_session=session_id, released=False)
        if moved is not Moved.REFUSED:  # LOST: taken or stopped meanwhile
            return session_id if moved is Moved.MOVED else ""
    return ""


def renewed_lately(session: dict, now_ms: int) -> bool:
    """LIVE, and renewed within half its lease (its expiry less its last renewal)."""
    expires, renewed = int(session.get(schema.EXPIRES_AT_MS, 0)), int(session.get(schema.HEARTBEAT_AT_MS, 0))
    return session.get(schema.SESSION_STATE) == schema.LIVE and expires > now_ms and now_ms - renewed < (expires - renewed) / 2
