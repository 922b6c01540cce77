"""The bounce detector: every time a connection's fence climbs, something outside the
workers' own say-so must explain the move. Pure functions over the emulator's journal and
the nemesis's history.

A move is an acquisition in the journal (a fence above every one the connection had).
It is explained, in this order, by:

* ``first``: the connection's first acquisition (after its START);
* ``ended``: the session that held it was ended before it (in the journal's order): a
  crash, a freeze or a lost session taken over, or a clean exit;
* ``api``: a START or STOP of the connection was sent after the acquisition before;
* ``process``: its holder's worker was hit by a process fault (killed, frozen,
  terminated, the drainer of a drain_term) before it: a leaving worker releases;
* ``emulator``: a DynamoDB or ambiguous-write fault was on between the two acquisitions,
  or had healed less than the crash bound before (a session lost in it, an acquisition
  or a release whose answer was lost);
* ``shed``: the holder had held it for at least the balancer's minimum hold
  (``worker.balancer.MIN_HOLD_S``: no connection held for less is ever shed, so none is
  shed twice within it). The workers' ``rebalance_shed`` lines are claims and are not read.

Anything else is a bounce: a connection given up and taken again with nothing to make
it move, as when one bad frame failed its runner at every owner in turn and the fence
climbed every few seconds (issue 17, item 2). Upstream faults (drops, stalls, bad
frames, seq jumps) explain no move: none may cost a connection its owner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from wsfleet import schema
from wsfleet.worker.balancer import MIN_HOLD_S
from .history import Applied, Op
from .schedule import DYNAMODB, Bounds

REASONS = ("first", "ended", "api", "process", "emulator", "shed")


@dataclass(frozen=True)
class Move:
    """One acquisition of a connection, with what explains it (None: nothing)."""

    pk: str
    fence: int
    t: float  # epoch seconds, by the emulator's clock
    worker: str
    prev_t: float | None  # the acquisition before (None for the first)
    prev_worker: str
    why: str | None


def moves(journal: Sequence[dict[str, Any]], applied: Sequence[Applied], ops: Sequence[Op], bounds: Bounds) -> list[Move]:
    """Every acquisition in the journal, in its order, explained as the module says."""
    ended: set[str] = set()
    last: dict[str, dict[str, Any]] = {}
    out = []
    for e in journal:
        if e.get("op") == "ended":
            ended.add(e.get("session", ""))
            continue
        pk, fence = e.get("pk"), e.get("fence")
        if e.get("op") != "update" or pk is None or fence is None:
            continue
        prev = last.get(pk)
        if prev is not None and fence <= prev["fence"]:
            continue  # a write that answered the item (a checkpoint): no acquisition
        last[pk] = e
        t = e.get("t_ms", 0) / 1000
        prev_t = prev.get("t_ms", 0) / 1000 if prev is not None else None
        why = _explain(pk, t, prev, prev_t, ended, applied, ops, bounds)
        out.append(Move(pk, fence, t, e.get("worker") or "", prev_t, (prev or {}).get("worker") or "", why))
    return out


def _explain(
    pk: str, t: float, prev: dict[str, Any] | None, prev_t: float | None, ended: set[str],
    applied: Sequence[Applied], ops: Sequence[Op], bounds: Bounds,
) -> str | None:
    if prev is None or prev_t is None:
        return "first"
    if prev.get("session") in ended:
        return "ended"
    cid = schema.connection_id_from_pk(pk)
    # Sent after the acquisition before (ms apart at least: the journal's clock is in ms).
    # One sent earlier moved that one: a STOP that lands later still needs a START after.
    if any(op.connection_id == cid and prev_t - 0.001 < op.t <= t for op in ops):
        return "api"
    holder = prev.get("worker")
    if any(holder in (a.victim, a.drainer) and a.started_at <= t for a in applied if holder):
        return "process"
    for a in applied:
        if a.kind in DYNAMODB and a.started_at <= t and prev_t <= (a.healed_at or t) + bounds.after_dynamodb_s:
            return "emulator"
    if t - prev_t >= MIN_HOLD_S:
        return "shed"
    return None
