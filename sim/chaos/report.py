"""What a chaos run showed: the faults by kind with their recovery times against their
bounds, the data, every violation, and how to replay the run. Pure rendering."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from typing import Any, Mapping, Sequence

from . import machine
from .checker import VIOLATION_KINDS, Verdict
from .history import Applied, Op
from .machine import CpuSample
from .moves import REASONS
from .recovery import Recovery, bound_for, kind_summary
from .schedule import Bounds, Schedule

MAX_LISTED = 25


def fmt_s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}s"


def render(
    schedule: Schedule, verdict: Verdict, *, settings: str, replay: str, cpu: Sequence[CpuSample] = ()
) -> list[str]:
    kinds = kind_summary(verdict.recoveries)
    header = f"{'kind':<13} {'faults':>6} {'conns':>6} {'p50':>8} {'max':>8} {'bound':>8}  over bound"
    lines = [
        f"== chaos, seed {schedule.seed}: {settings}",
        "== faults by kind; recovery = until every connection the fault touched was whole again",
        "   (p50 / max over the faults of that kind)",
        header,
        "-" * len(header),
    ]
    for kind, k in sorted(kinds.items()):
        lines.append(
            f"{kind:<13} {k['faults']:>6} {k['connections']:>6} {fmt_s(k['p50_s']):>8} {fmt_s(k['max_s']):>8} "
            f"{fmt_s(k['bound_s']):>8}  {k['over_bound']}"
        )
    handovers = sorted(r.since_signal_s for r in verdict.recoveries if r.since_signal_s is not None)
    t = verdict.totals
    lines += [
        f"{'total':<13} {len(verdict.recoveries):>6}",
        *([f"(term, clock: each connection's gap, from its old socket's close to its new one; from the SIGTERM to "
           f"the last new socket, the whole handover: p50 {fmt_s(statistics.median(handovers))}, "
           f"max {fmt_s(handovers[-1])})"] if handovers else []),
        "",
        "== data",
        f"upstream produced {t['produced']} frames; {t['stored']} rows stored; {t['sockets']} sockets opened; "
        f"{t.get('rewrites', 0)} rows rewritten by a later owner (a replay after a takeover: same key, same data)",
        f"two sockets on one stream while a worker was frozen (its kernel kept the socket): {t['overlaps_excused']}",
        f"messages a frozen worker had already sent, landing as it woke (older fence, same data): {t.get('late_in_flight', 0)}",
        f"ownership moves (acquisitions) {sum(t.get(f'moves_{r}', 0) for r in REASONS)}: first {t.get('moves_first', 0)}, "
        f"after the holder's session ended {t.get('moves_ended', 0)}, after a START or STOP {t.get('moves_api', 0)}, "
        f"after a process fault on the holder {t.get('moves_process', 0)}, in or after a DynamoDB fault "
        f"{t.get('moves_emulator', 0)}, sheds {t.get('moves_shed', 0)}; unexplained: see bounce",
        f"sockets to an old url opened before its owner could know of the STOP (within the STOP bound): "
        f"{t.get('old_url_reconnects', 0)}",
        f"DynamoDB load from the chaos phase on: {t.get('dynamodb_requests_per_s', '-')} requests/s, "
        f"{t.get('dynamodb_writes_per_s', '-')} writes/s (the emulator's budget: about 80 writes/s)",
        *([f"messages stream: {t['stream_records']} records in {t['stream_kinesis_records']} Kinesis records; "
           f"again with the same fence (resent) {t['stream_resent']}, "
           f"with a higher fence after {t['stream_takeovers_again']} takeovers {t['stream_again_after_takeover']} "
           f"(most after one: {t['stream_most_again']}, its bound {t['stream_most_again_bound']}); "
           f"a lower fence landing as its frozen writer woke: {t['stream_stale_excused']}"] if "stream_records" in t else []),
        "",
        "== invariants (violations)",
        " | ".join(f"{kind} {verdict.count(kind)}" for kind in VIOLATION_KINDS),
    ]
    for v in verdict.violations[:MAX_LISTED]:
        lines.append(f"  {v.kind:<16} {v.what:<14} {v.detail}")
    if len(verdict.violations) > MAX_LISTED:
        lines.append(f"  ... and {len(verdict.violations) - MAX_LISTED} more (report.json)")
    lines += machine_lines(verdict.recoveries, cpu)
    lines += ["", "== cross-check against the workers' own logs (not evidence)", *[f"  {n}" for n in verdict.notes], ""]
    lines.append("PASSED" if verdict.passed else f"FAILED: {len(verdict.violations)} violations")
    lines.append(f"replay: {replay}")
    return lines


def recovery_cpu(r: Recovery, cpu: Sequence[CpuSample]) -> machine.Window | None:
    """CPU (cores) of this run and of every other process while ``r``'s fault recovered."""
    return machine.window(cpu, *r.span()) if cpu else None


def machine_lines(recoveries: Sequence[Recovery], cpu: Sequence[CpuSample]) -> list[str]:
    """The machine's CPU over the run, and beside every fault over its bound what the
    rest of the machine used meanwhile: the bounds assume the run has the cores."""
    m = machine.summary(cpu)
    if not m:
        return []
    lines = [
        "",
        f"== the machine ({m['cores']} cores; CPU in cores, from /proc; means over the run, max over 10-s windows)",
        f"this run's processes {m['ours_mean']:.2f} (max {m['ours_max']:.2f}); other processes {m['others_mean']:.2f} "
        f"(max {m['others_max']:.2f}, above {machine.BUSY_SHARE:g} in {m['busy_windows']} of {m['windows']} windows); "
        f"one-minute load up to {m['load1_max']:.2f}",
    ]
    for r in recoveries:
        if r.time_s is not None and r.time_s <= r.bound_s:
            continue
        w = recovery_cpu(r, cpu)
        if w is not None:
            busy = "busy" if w.others > machine.BUSY_SHARE else "quiet"
            lines.append(f"  #{r.applied.n} {r.applied.kind} over its bound: other processes {w.others:.2f} cores, "
                         f"this run {w.ours:.2f}, while it recovered ({busy} machine)")
    return lines


def as_json(
    schedule: Schedule,
    verdict: Verdict,
    applied: Sequence[Applied],
    ops: Sequence[Op],
    bounds: Bounds,
    *,
    settings: Mapping[str, Any],
    replay: str,
    cpu: Sequence[CpuSample] = (),
) -> str:
    def cores(r: Recovery) -> dict[str, float] | None:
        w = recovery_cpu(r, cpu)
        return None if w is None else {"ours": round(w.ours, 2), "others": round(w.others, 2)}

    return json.dumps(
        {
            "seed": schedule.seed,
            "settings": dict(settings),
            "passed": verdict.passed,
            "replay": replay,
            "violations": {kind: verdict.count(kind) for kind in VIOLATION_KINDS},
            "violation_list": [asdict(v) for v in verdict.violations],
            "kinds": kind_summary(verdict.recoveries),
            "faults": [
                {
                    **{k: v for k, v in asdict(r.applied).items() if k != "affected"},
                    "affected": len(r.applied.affected),
                    "bound_s": round(bound_for(r.applied, bounds), 3),
                    "recovery_s": r.time_s,
                    "took_s": r.took_s,
                    "since_signal_s": r.since_signal_s,
                    "cpu_cores": cores(r),
                }
                for r in verdict.recoveries
            ],
            "schedule": json.loads(schedule.to_json())["faults"],
            "ops": len(ops),
            "totals": verdict.totals,
            "notes": verdict.notes,
            "machine": machine.summary(cpu),
        },
        indent=1,
    )
