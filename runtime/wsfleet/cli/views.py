"""What the table commands show, as the data ``--json`` prints: the fleet at a glance
(``status``) and connections with their owners. Each reads through a
:class:`FleetReader` and decides what the items mean at ``now``; none renders.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .. import schema
from ..leases import released_at_fence
from .fleet import FleetReader, Session


def _age_s(now: int, then_ms: int) -> float:
    return round((now - then_ms) / 1000, 1)


def status(reader: FleetReader, now: int) -> dict:
    """The fleet at a glance: live workers, sessions not live that may hold connections,
    counts by desired state, STARTED but unowned, the oldest checkpoint (``status --help``).

    Unowned: free (the FREE# partitions), attached to a session that is not live, or
    handed off by a live one and not taken yet (released at its fence: attached, but
    nobody holds its socket; GET shows it without an owner too)."""
    sessions = reader.sessions()
    live = {sid for sid, s in sessions.items() if s.live_at(now)}
    summary = reader.summary(live)

    # STARTED and unowned: the FREE# partitions (every one up to STATE_SHARDS, and any
    # the Scan saw beyond it), whatever is attached to a session that is not live, and
    # what a live one handed off (the Scan found them).
    free = [
        (cid, schema.free_partition(shard), None)
        for shard in range(max(reader.tables.state_shards, max(summary.free_shards, default=-1) + 1))
        for cid in reader.connections.free(shard)
    ]
    dead = [s for s in sessions.values() if s.holds_orphans_at(now)]
    attached = [
        (owned.connection_id, schema.owner_key_session(s.session_id), s)
        for s in dead
        for owned in reader.connections.owned_by(s.session_id)
        if owned.desired_state == schema.STARTED
    ]
    handed = [
        (schema.connection_id_from_pk(item[schema.PK]), schema.owner_key_session(sid), sessions[sid])
        for item in summary.handed_off
        for sid in [item[schema.LEASE_SESSION]]
    ]
    items = reader.items([cid for cid, _, _ in free + attached + handed])
    unowned = []
    for cid, partition, session in free + attached + handed:
        item = items.get(cid)
        # The index (and the Scan) lag the table: keep only what the item itself still says.
        if item is None or item.get(schema.DESIRED_STATE) != schema.STARTED:
            continue
        if item.get(schema.LEASE_SESSION, "") != (session.session_id if session else ""):
            continue
        in_handoff = session is not None and session.session_id in live
        if in_handoff and not released_at_fence(item):
            continue  # no longer released at its fence: owned again
        if in_handoff or not session:
            since = int(item.get(schema.UPDATED_AT_MS, 0))  # the release, or the free
        else:
            since = session.expires_at_ms
        unowned.append(
            {
                "connection_id": cid,
                "partition": partition,
                "worker_id": session.worker_id if session else "",
                "session_state": "handed off" if in_handoff else session.describe(now) if session else "",
                "unowned_for_s": _age_s(now, since),
            }
        )

    oldest = summary.oldest_owned
    return {
        "now_ms": now,
        "workers": [
            {
                "worker_id": s.worker_id,
                "session_id": s.session_id,
                "session_age_s": _age_s(now, s.started_at_ms),
                "active": s.active,
                "max_connections": s.max_connections,
                "heartbeat_age_s": _age_s(now, s.heartbeat_at_ms),
                "expires_in_s": -_age_s(now, s.expires_at_ms),
            }
            for s in sorted((sessions[sid] for sid in live), key=lambda s: (s.worker_id, s.session_id))
        ],
        "sessions_not_live_holding": [
            {
                "worker_id": s.worker_id,
                "session_id": s.session_id,
                "state": s.describe(now),
                "expired_s_ago": _age_s(now, s.expires_at_ms),
                "ended_by": s.ended_by,
            }
            for s in sorted(dead, key=lambda s: s.expires_at_ms)
        ],
        "connections": {
            schema.STARTED: summary.by_state.get(schema.STARTED, 0),
            schema.STOPPED: summary.by_state.get(schema.STOPPED, 0),
            "total": sum(summary.by_state.values()),
        },
        "unowned": sorted(unowned, key=lambda u: -u["unowned_for_s"]),
        # STARTED connections whose owner cannot connect (the upstream refused it, or a
        # secret could not be read), as the owner last wrote it: longest first.
        "refused": [
            {
                "connection_id": schema.connection_id_from_pk(item[schema.PK]),
                "last_error": item[schema.LAST_ERROR],
                "since_s": _age_s(now, int(item.get(schema.LAST_ERROR_AT_MS, now))),
            }
            for item in sorted(summary.refused, key=lambda i: int(i.get(schema.LAST_ERROR_AT_MS, now)))
        ],
        # STARTED connections the crash-loop breaker set aside until a START (wsfleet retry).
        "quarantined": [
            {
                "connection_id": schema.connection_id_from_pk(item[schema.PK]),
                "reason": str(item[schema.QUARANTINED].get("reason", "")),
                "since_s": _age_s(now, int(item[schema.QUARANTINED].get("at_ms", now))),
            }
            for item in sorted(summary.quarantined, key=lambda i: int(i[schema.QUARANTINED].get("at_ms", now)))
        ],
        "oldest_checkpoint": None
        if oldest is None
        else {
            "connection_id": schema.connection_id_from_pk(oldest[schema.PK]),
            "updated_at_ms": int(oldest.get(schema.UPDATED_AT_MS, 0)),
            "age_s": _age_s(now, int(oldest.get(schema.UPDATED_AT_MS, 0))),
        },
    }


def connections(reader: FleetReader, now: int, *, worker: str | None, state: str | None) -> list[dict]:
    """Every connection (a Scan), or those attached to ``worker``'s sessions (by_owner
    queries, then a BatchGetItem); only ``state`` if given."""
    sessions = reader.sessions()
    if worker:
        mine = [s for s in sessions.values() if s.worker_id == worker and (s.state == schema.LIVE or s.in_ring)]
        ids = [o.connection_id for s in mine for o in reader.connections.owned_by(s.session_id)]
        items = [i for i in reader.items(ids).values() if not state or i.get(schema.DESIRED_STATE) == state]
    else:
        items = reader.all_connections(state)
    return _connection_rows(items, sessions, now)


def worker_names(reader: FleetReader) -> list[str]:
    """The workers with a live session or one still in the ring."""
    return sorted({s.worker_id for s in reader.sessions().values() if s.state == schema.LIVE or s.in_ring})


def known_worker(reader: FleetReader, worker: str) -> bool:
    return worker in worker_names(reader)


def _owner(item: Mapping[str, Any], sessions: Mapping[str, Session], now: int) -> tuple[str, bool]:
    """(who holds it, as shown; whether that session owns it now)."""
    session_id = item.get(schema.LEASE_SESSION, "")
    if not session_id:
        return "-", False
    session = sessions.get(session_id)
    worker = item.get(schema.LEASE_OWNER, "") or (session.worker_id if session else "?")
    if released_at_fence(item):
        return f"{worker} (handed off)", False  # not taken yet: nobody holds its socket (GET: no owner)
    if session is not None and session.live_at(now):
        return worker, True
    return f"{worker} ({session.describe(now) if session else 'session gone'})", False


def _connection_rows(items: Sequence[dict], sessions: Mapping[str, Session], now: int) -> list[dict]:
    rows = []
    for item in sorted(items, key=lambda i: i[schema.PK]):
        owner, owned = _owner(item, sessions, now)
        rows.append(
            {
                "connection_id": schema.connection_id_from_pk(item[schema.PK]),
                "desired_state": item.get(schema.DESIRED_STATE, ""),
                "ws_url": item.get(schema.WS_URL, ""),
                "lease_owner": item.get(schema.LEASE_OWNER, ""),
                "lease_session": item.get(schema.LEASE_SESSION, ""),
                "owned": owned,
                "owner": owner,
                "fence_token": int(item.get(schema.FENCE_TOKEN, 0)),
                "last_seq": int(item.get(schema.LAST_SEQ, 0)),
                "updated_at_ms": int(item.get(schema.UPDATED_AT_MS, 0)),
                # The stored form (secret ARNs, never values); {} for the default protocol.
                "upstream": item.get(schema.UPSTREAM) or {},
                "last_error": item.get(schema.LAST_ERROR),
                "last_error_at_ms": item.get(schema.LAST_ERROR_AT_MS),
            }
        )
    return rows
