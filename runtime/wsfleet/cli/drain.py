"""``wsfleet drain WORKER``: ask one live worker to hand every connection over and leave.

The worker is found in the sessions table (a Scan, as ``status`` reads it) by its worker id
or one of its session ids; what it holds, in the ``by_owner`` index. The request is one
conditional UpdateItem of its session item (:meth:`wsfleet.store.SessionsStore.request_drain`:
``drain_requested``, who asked and when, set only while the session is LIVE). The worker's
next renewal returns it, and it leaves as on SIGTERM: every connection handed over to its
peers a few at a time, its session ended, exit 0 (ECS starts a replacement). ``--wait``
reads again until the session is ENDED and each connection it held is held by a live peer.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import time
from typing import Any, Callable, Mapping, Sequence

from .. import schema
from ..leases import released_at_fence
from ..store import SessionsStore, now_ms
from . import commands, locate, render
from .arguments import _seconds
from .errors import CliError
from .fleet import FleetReader, Session

DEFAULT_TIMEOUT_S = 120.0  # a heartbeat, SHUTDOWN_SECONDS (25) and the takers' acquisitions, with room
POLL_S = 1.0
NAMED = 5  # connections a timeout's sentence names, at most


def add_parser(subcommands: Any, tables: argparse.ArgumentParser) -> None:
    drain = subcommands.add_parser(
        "drain",
        parents=[tables],
        help="ask one live worker to hand all its connections over to its peers and exit",
        description=(
            "Ask one live worker to leave, as SIGTERM would have it: one conditional write sets drain_requested "
            "(who asked, read from STS GetCallerIdentity, and when) on its LIVE session item; the worker's next "
            "renewal (within a heartbeat) brings it, and it hands every connection over to its peers a few at a "
            "time, ends its session and exits 0, and ECS starts a replacement. The last live worker drains too: its "
            "connections wait, unowned, for the next worker. WORKER is a worker id or a session id, as status lists "
            "them. A worker that is unknown, or whose session is not live (ENDED, or expired), is an error; asking "
            "twice keeps the first request. Needs Scan, Query and UpdateItem on the tables."
        ),
    )
    drain.add_argument("worker", metavar="WORKER", help="a worker id (ECS task id) or a session id, as status lists them")
    how = drain.add_mutually_exclusive_group()
    how.add_argument(
        "--wait",
        action="store_true",
        help="then read again every --interval until its session is ENDED and each connection it held is held by a "
        "live peer (or STOPPED); exit 1 past --timeout",
    )
    how.add_argument("--dry-run", action="store_true", help="only show which session would be asked and what it holds (reads only)")
    drain.add_argument(
        "--timeout", type=_seconds, default=DEFAULT_TIMEOUT_S, metavar="S", help=f"with --wait, give up after S seconds [{DEFAULT_TIMEOUT_S:g}]"
    )
    drain.add_argument("--interval", type=_seconds, default=POLL_S, metavar="S", help=f"seconds between reads with --wait [{POLL_S:g}]")
    drain.set_defaults(run=run)


# --- which session ---------------------------------------------------------------------------


def resolve(sessions: Mapping[str, Session], name: str, now: int) -> Session:
    """The one live session ``name`` (a session id, else a worker id) names; else the
    :class:`CliError` that says why there is nothing to drain."""
    if name in sessions and sessions[name].worker_id:  # not the fleet summary's item (#fleet)
        session = sessions[name]
        if not session.live_at(now):
            raise CliError(
                f"session {name} (worker {session.worker_id}) is {session.describe(now)}: only a live session can be drained"
            )
        return session
    mine = sorted((s for s in sessions.values() if s.worker_id == name), key=lambda s: s.started_at_ms)
    if not mine:
        live = sorted({s.worker_id for s in sessions.values() if s.live_at(now)})
        raise CliError(
            f"no worker {name!r} in the sessions table: give a worker id or a session id as `wsfleet status` lists "
            f"them (live workers: {', '.join(live) or 'none'})"
        )
    live = [s for s in mine if s.live_at(now)]
    if not live:
        newest = mine[-1]
        raise CliError(
            f"worker {name} has no live session (its newest, {newest.session_id}, is {newest.describe(now)}): "
            "only a live worker can be drained"
        )
    if len(live) > 1:
        raise CliError(f"worker {name} has {len(live)} live sessions ({', '.join(s.session_id for s in live)}): name one by its session id")
    return live[0]


def attached(reader: FleetReader, session_id: str) -> list[str]:
    """The STARTED connections attached to the session, as the by_owner index has them."""
    return sorted(o.connection_id for o in reader.connections.owned_by(session_id) if o.desired_state == schema.STARTED)


def caller(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """Who asks: the caller's ARN (STS GetCallerIdentity, which any credentials may call),
    else user@host where that cannot be read."""
    try:
        return str(locate.client(locate.aws_session(args.region, env), "sts", env).get_caller_identity()["Arn"])
    except Exception:  # noqa: BLE001 - the name of who asked is worth a try, not a failure
        try:
            return f"{getpass.getuser()}@{socket.gethostname()}"
        except Exception:  # noqa: BLE001 - no user name in this environment
            return f"unknown@{socket.gethostname()}"


# --- until drained ------------------------------------------------------------------------------


def progress(reader: FleetReader, session: Session, held: Sequence[str], now: int) -> dict:
    """Where the drain of ``session`` stands: its state; who holds what it held (and what
    is attached to it now); what is still waiting, and why. Done once it is ENDED and every
    one is held by a live session of another worker, or no longer STARTED."""
    sessions = reader.sessions()
    own = sessions.get(session.session_id)
    state = own.state if own is not None else "gone"
    ids = sorted({*held, *attached(reader, session.session_id)})
    items = reader.items(ids)
    owners: dict[str, int] = {}
    stopped = 0
    waiting: dict[str, str] = {}
    for cid in ids:
        item = items.get(cid)
        if item is None or item.get(schema.DESIRED_STATE) != schema.STARTED:
            stopped += 1  # STOPPED (or deleted) meanwhile: nothing to hold
            continue
        holder = sessions.get(item.get(schema.LEASE_SESSION, ""))
        if holder is None:
            waiting[cid] = "free"
        elif released_at_fence(item):
            waiting[cid] = f"handed off by {holder.worker_id}, not taken yet"
        elif holder.worker_id == session.worker_id:
            waiting[cid] = f"held by {holder.worker_id} ({holder.describe(now)})"
        elif not holder.live_at(now):
            waiting[cid] = f"attached to {holder.worker_id} ({holder.describe(now)})"
        else:
            owners[holder.worker_id] = owners.get(holder.worker_id, 0) + 1
    done = state != schema.LIVE and not waiting
    return {"session_state": state, "owners": dict(sorted(owners.items())), "stopped": stopped, "waiting": waiting, "done": done}


def wait(
    reader: FleetReader,
    session: Session,
    held: Sequence[str],
    *,
    timeout: float,
    interval: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[dict, float]:
    """Read :func:`progress` every ``interval`` until done or ``timeout`` seconds have
    passed: (the last reading, the seconds waited)."""
    started = clock()
    while True:
        got = progress(reader, session, held, now_ms())
        waited = clock() - started
        if got["done"] or waited >= timeout:
            return got, waited
        sleep(min(interval, max(0.0, timeout - waited)))


# --- the command --------------------------------------------------------------------------------


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    ddb, tables = commands.tables_of(args, env, "connections", "sessions")
    reader = FleetReader(ddb, tables)
    now = now_ms()
    sessions = reader.sessions()
    session = resolve(sessions, args.worker, now)
    held = attached(reader, session.session_id)
    peers = sorted({s.worker_id for s in sessions.values() if s.live_at(now) and s.worker_id != session.worker_id})
    shown: dict[str, Any] = {
        "worker_id": session.worker_id,
        "session_id": session.session_id,
        "connections": len(held),
        "connection_ids": held,
        "live_peers": peers,
        "dry_run": args.dry_run,
    }
    name = f"{session.worker_id} (session {session.session_id})"
    if args.dry_run:
        _emit(args, shown, f"would ask {name} to drain (dry run: nothing written): it holds {_n(len(held))}, with {_peers(peers)}")
        return 0

    asked_at = now_ms()
    new, old = SessionsStore(ddb, tables.sessions).request_drain(session.session_id, by=caller(args, env))
    if new is None:
        now_state = "gone" if old is None else old.get(schema.SESSION_STATE, "?")
        raise CliError(f"session {session.session_id} (worker {session.worker_id}) is no longer live ({now_state}): nothing was written")
    request = new.get(schema.DRAIN_REQUESTED) or {}
    by, at_ms = str(request.get(schema.DRAIN_BY, "")), int(request.get(schema.DRAIN_AT_MS, 0))
    already = at_ms < asked_at
    shown.update(requested_by=by, requested_at_ms=at_ms, already_asked=already)
    asked = (
        f"{name} was already asked to drain, by {by} {render.duration((now_ms() - at_ms) / 1000)} ago"
        if already
        else f"asked {name} to drain"
    )
    if peers:
        then = (
            f"its {_n(len(held))} move to its {_peers(peers)} within about a heartbeat; then it ends its session and "
            "exits (ECS starts a replacement)"
        )
    else:
        then = (
            f"it is the only live worker: its {_n(len(held))} are released unowned until another worker starts; it "
            "ends its session and exits (ECS starts a replacement, which takes them)"
        )
    sentence = f"{asked}: {then}"
    if not args.wait:
        _emit(args, shown, sentence)
        return 0

    if not args.json:
        print(sentence, flush=True)
    got, waited = wait(reader, session, held, timeout=args.timeout, interval=args.interval)
    shown["drained"] = {**got, "waited_s": round(waited, 1)}
    if args.json:
        print(json.dumps(shown, indent=2))
    if not got["done"]:
        raise CliError(_not_yet(session, got, args.timeout, peers))
    if not args.json:
        held_by = ", ".join(f"{w} ({n})" for w, n in got["owners"].items()) or "nobody"
        stopped = f", {got['stopped']} STOPPED meanwhile" if got["stopped"] else ""
        print(f"{session.worker_id} drained in {render.duration(waited)}: session {got['session_state']}; held now by {held_by}{stopped}")
    return 0


def _not_yet(session: Session, got: Mapping[str, Any], timeout: float, peers: Sequence[str]) -> str:
    waiting = got["waiting"]
    named = ", ".join(f"{cid} ({why})" for cid, why in list(waiting.items())[:NAMED])
    more = f" and {len(waiting) - NAMED} more" if len(waiting) > NAMED else ""
    parts = [f"{session.worker_id} not drained after {render.duration(timeout)}: session {session.session_id} is {got['session_state']}"]
    if waiting:
        parts.append(f"{len(waiting)} of its connections not held by a live peer yet: {named}{more}")
    if not peers:
        parts.append("no other worker was live: they wait for the next one to start")
    return "; ".join(parts)


def _n(count: int) -> str:
    return f"{count} connection" + ("" if count == 1 else "s")


def _peers(peers: Sequence[str]) -> str:
    return f"{len(peers)} live peer" + ("" if len(peers) == 1 else "s")


def _emit(args: argparse.Namespace, value: Any, human: str) -> None:
    print(json.dumps(value, indent=2) if args.json else human)
