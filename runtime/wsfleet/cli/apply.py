"""``wsfleet apply -f FILE``: many connections brought to the state a file describes,
through the API as any caller does, sending only what differs.

Each entry is compared with what ``GET /connections/ID`` answers, and one action decided
(:func:`decide`, no I/O): ``create`` (unknown, to run: START), ``change`` (to run, and
STOPPED or with another ws_url or upstream: START, after a STOP when it is STARTED,
since a STARTED connection keeps its ws_url and upstream), ``stop`` (STARTED, to stop:
STOP) or ``unchanged`` (nothing sent: applying a file twice changes nothing). Entries go
``CONCURRENCY`` at a time; one that fails is reported with its line and the API's
sentence, and the others go on.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, TextIO

from .. import schema
from .api import ApiClient, ApiReply
from .desired import Desired
from .errors import CliError

CONCURRENCY = 16  # entries in flight at once: each is one GET and at most a STOP and a START
CREATE, CHANGE, STOP, UNCHANGED = "create", "change", "stop", "unchanged"
ACTIONS = (CREATE, CHANGE, STOP, UNCHANGED)
MARKS = {CREATE: "+", CHANGE: "~", STOP: "-", UNCHANGED: "="}
# A throttle (429) or a passing 5xx is sent again after these pauses, then reported.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRY_PAUSES_S = (0.5, 1.0, 2.0)


@dataclass(frozen=True)
class Decision:
    action: str
    detail: str  # what differs, for people: "ws_url ws://a -> ws://b", "STOPPED -> STARTED"
    stop_first: bool = False  # a STARTED connection to change: STOP, then START


@dataclass
class Outcome:
    entry: Desired
    action: str = ""
    detail: str = ""
    error: str = ""  # the API's sentence, or why the entry could not be applied


def decide(entry: Desired, current: dict | None) -> Decision:
    """What to send for ``entry``, given the connection's public state (None: unknown)."""
    if current is None:
        return Decision(CREATE, entry.ws_url) if entry.running else Decision(UNCHANGED, "unknown, and to stay stopped")
    started = current.get(schema.DESIRED_STATE) == schema.STARTED
    if not entry.running:
        return Decision(STOP, "STARTED -> STOPPED") if started else Decision(UNCHANGED, "STOPPED")
    differs = []
    if current.get(schema.WS_URL) != entry.ws_url:
        differs.append(f"ws_url {current.get(schema.WS_URL)} -> {entry.ws_url}")
    if (current.get(schema.UPSTREAM) or {}) != entry.upstream:
        keys = sorted(k for k in {*(current.get(schema.UPSTREAM) or {}), *entry.upstream}
                      if (current.get(schema.UPSTREAM) or {}).get(k) != entry.upstream.get(k))
        differs.append("upstream " + ", ".join(keys))
    if not started:
        return Decision(CHANGE, "; ".join(["STOPPED -> STARTED", *differs]))
    if differs:
        return Decision(CHANGE, "; ".join(differs), stop_first=True)
    return Decision(UNCHANGED, "STARTED")


NOT_FOUND = "connection_not_found"  # the router's error code for an unknown connection


def _got(reply: ApiReply) -> dict | None:
    """The connection's state; None when the router says it knows no such connection (a
    404 from anything else, a wrong URL's, is a failure, not an absence)."""
    if reply.status == 404 and reply.body.get("error") == NOT_FOUND:
        return None
    if not reply.ok:
        raise _Failed(reply.sentence())
    return reply.body


class _Failed(Exception):
    """One entry's request refused: the API's sentence."""


def _patiently(send: Callable[[], ApiReply]) -> ApiReply:
    """A request sent again after a throttle or a 5xx the API asks to retry (every
    request apply sends is idempotent: a START or STOP that landed twice changes nothing)."""
    for pause in RETRY_PAUSES_S:
        reply = send()
        if reply.status not in RETRY_STATUSES:
            return reply
        time.sleep(pause)
    return send()


def apply_one(client: ApiClient, entry: Desired, *, dry_run: bool) -> Outcome:
    """GET the connection, decide, and (unless ``dry_run``) send what differs."""
    outcome = Outcome(entry)
    cid = entry.connection_id
    try:
        decision = decide(entry, _got(_patiently(lambda: client.get(cid))))
        outcome.action, outcome.detail = decision.action, decision.detail
        if dry_run or decision.action == UNCHANGED:
            return outcome
        if decision.action == STOP or decision.stop_first:
            stopped = _patiently(lambda: client.stop(cid))
            if not stopped.ok:
                raise _Failed(stopped.sentence())
        if decision.action != STOP:
            started = _patiently(lambda: client.start(cid, entry.ws_url, entry.upstream or None))
            if not started.ok:
                raise _Failed(started.sentence())
    except (_Failed, CliError) as error:
        outcome.error = str(error)
    return outcome


def apply_all(
    client: ApiClient,
    entries: list[Desired],
    *,
    dry_run: bool,
    progress: Callable[[int, int], None] = lambda done, total: None,
    concurrency: int = CONCURRENCY,
) -> list[Outcome]:
    """Every entry, ``concurrency`` at a time, in the file's order. The first entry goes
    alone: when its GET fails (an API out of reach, a wrong URL, no permission) that is
    one error within the request timeout, and nothing else is sent, not a thousand."""
    if not entries:
        return []
    first = apply_one(client, entries[0], dry_run=dry_run)
    if first.error and not first.action:
        raise CliError(f"GET /connections/{first.entry.connection_id} failed, so nothing was sent: {first.error}")
    outcomes: list[Outcome] = [first]
    lock, done = threading.Lock(), [1]
    progress(1, len(entries))

    def one(entry: Desired) -> Outcome:
        got = apply_one(client, entry, dry_run=dry_run)
        with lock:
            done[0] += 1
            progress(done[0], len(entries))
        return got

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="apply") as pool:
        outcomes += list(pool.map(one, entries[1:]))
    return outcomes


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    out = {action: 0 for action in ACTIONS}
    for o in outcomes:
        if o.action and not o.error:
            out[o.action] += 1
    out["failed"] = sum(1 for o in outcomes if o.error)
    return out


def result(outcomes: list[Outcome], *, path: str, dry_run: bool) -> dict[str, Any]:
    """What ``--json`` prints: the counts, and every entry with its line and outcome."""
    return {
        "file": path,
        "dry_run": dry_run,
        "counts": counts(outcomes),
        "entries": [
            {
                "line": o.entry.line,
                "connection_id": o.entry.connection_id,
                "action": o.action or None,
                "detail": o.detail,
                "status": "failed" if o.error else ("planned" if dry_run and o.action != UNCHANGED else
                                                   "unchanged" if o.action == UNCHANGED else "done"),
                **({"error": o.error} if o.error else {}),
            }
            for o in outcomes
        ],
    }


def render(outcomes: list[Outcome], *, path: str, dry_run: bool) -> str:
    """A line per entry that changes or fails (``+`` create, ``~`` change, ``-`` stop,
    ``!`` failed), then the counts."""
    lines = []
    for o in outcomes:
        where = f"{path}:{o.entry.line}"
        if o.error:
            lines.append(f"! {o.entry.connection_id}  {where}: {o.action or 'get'} failed: {o.error}")
        elif o.action != UNCHANGED:
            lines.append(f"{MARKS[o.action]} {o.entry.connection_id}  {o.action}: {o.detail}")
    c = counts(outcomes)
    verb = "dry run, nothing sent" if dry_run else "applied"
    summary = f"{c[CREATE]} create, {c[CHANGE]} change, {c[STOP]} stop, {c[UNCHANGED]} unchanged"
    lines.append(f"{path}: {len(outcomes)} connections ({verb}): {summary}" + (f", {c['failed']} failed" if c["failed"] else ""))
    return "\n".join(lines)


def progress_line(out: TextIO = sys.stderr) -> Callable[[int, int], None]:
    """A line redrawn in place on a terminal (nothing when ``out`` is not one)."""
    if not out.isatty():
        return lambda done, total: None

    def show(done: int, total: int) -> None:
        out.write(f"\rapplied {done}/{total}" + ("\n" if done == total else ""))
        out.flush()

    return show
