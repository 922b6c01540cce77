"""What a chaos run showed: the faults by kind with their recovery times against their
bounds, the data, every violation, and how to replay the run. Pure rendering."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, Mapping, Sequence

from .checker import VIOLATION_KINDS, Verdict
from .recovery import bound_for, kind_summary
from .history import Applied, Op
from .schedule import Bounds, Schedule

MAX_LISTED = 25


def fmt_s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}s"


def render(schedule: Schedule, verdict: Verdict, *, settings: str, replay: str) -> list[str]:
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
    t = verdict.totals
    lines += [
        f"{'total':<13} {len(verdict.recoveries):>6}",
        "",
        "== data",
        f"upstream produced {t['produced']} frames; {t['stored']} rows stored; {t['sockets']} sockets opened; "
        f"{t.get('rewrites', 0)} rows rewritten by a later owner (a replay after a takeover: same key, same data)",
        f"two sockets on one stream while a worker was frozen (its kernel kept the socket): {t['overlaps_excused']}",
        f"DynamoDB load from the chaos phase on: {t.get('dynamodb_requests_per_s', '-')} requests/s, "
        f"{t.get('dynamodb_writes_per_s', '-')} writes/s (the emulator's budget: about 80 writes/s)",
        "",
        "== invariants (violations)",
        " | ".join(f"{kind} {verdict.count(kind)}" for kind in VIOLATION_KINDS),
    ]
    for v in verdict.violations[:MAX_LISTED]:
        lines.append(f"  {v.kind:<16} {v.what:<14} {v.detail}")
    if len(verdict.violations) > MAX_LISTED:
        lines.append(f"  ... and {len(verdict.violations) - MAX_LISTED} more (report.json)")
    lines += ["", "== cross-check against the workers' own logs (not evidence)", *[f"  {n}" for n in verdict.notes], ""]
    lines.append("PASSED" if verdict.passed else f"FAILED: {len(verdict.violations)} violations")
    lines.append(f"replay: {replay}")
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
) -> str:
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
                }
                for r in verdict.recoveries
            ],
            "schedule": json.loads(schedule.to_json())["faults"],
            "ops": len(ops),
            "totals": verdict.totals,
            "notes": verdict.notes,
        },
        indent=1,
    )
