"""What a run's own ``report.json`` adds to its logs, when it has one (``make demo`` and
``make chaos`` write it; a deployed fleet's exported logs have none): the faults as time
bands, and the verdicts of the checks that judged the run.

The keys read (each optional):

* ``passed`` (bool), ``failures`` (sentences), ``seed``, ``replay`` (a command);
* ``faults``: each ``n``, ``kind``, ``started_at`` and ``healed_at`` (epoch seconds),
  ``victim``, ``recovery_s``, ``bound_s``: the chaos nemesis's faults as applied;
* ``violations``: ``{invariant: count}``, the chaos audit's;
* ``events``: each ``kind``, ``label``, ``at_s`` and ``until_s`` (seconds from
  ``t_origin``, epoch seconds), ``bound_s``, ``max_s``, ``pending``: the demo's
  scenario events and how long the connections they hit took.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPORT_JSON = "report.json"
# A fault that is a single act (a kill, a STOP) is drawn this wide, in seconds.
INSTANT_S = 1.0


@dataclass(frozen=True)
class Band:
    start: float
    end: float
    label: str
    detail: str


@dataclass(frozen=True)
class Verdict:
    name: str
    ok: bool
    detail: str


@dataclass
class Annotations:
    passed: bool | None = None  # None: nothing judged this run
    bands: list[Band] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # seed, replay command, failures


class BadReport(ValueError):
    """``report.json`` is there but is not a JSON object."""


def read(run_dir: Path | str) -> Annotations:
    path = Path(run_dir) / REPORT_JSON
    if not path.is_file():
        return Annotations(notes=[f"no {REPORT_JSON} beside the logs: no faults or verdicts to show"])
    try:
        report = json.loads(path.read_text())
    except ValueError as error:
        raise BadReport(f"{path} is not JSON: {error}") from None
    if not isinstance(report, dict):
        raise BadReport(f"{path} is not a JSON object")
    return from_report(report)


def from_report(report: dict[str, Any]) -> Annotations:
    out = Annotations(passed=report.get("passed") if isinstance(report.get("passed"), bool) else None)
    if "seed" in report:
        out.notes.append(f"seed {report['seed']}")
    if report.get("replay"):
        out.notes.append(f"replay: {report['replay']}")
    out.notes += [f"failed: {f}" for f in report.get("failures") or ()]
    for f in report.get("faults") or ():
        start = _num(f.get("started_at"))
        if start is None:
            continue
        end = _num(f.get("healed_at")) or start + INSTANT_S
        label = f"#{f.get('n', '?')} {f.get('kind', 'fault')}"
        bits = [f"victim {f['victim']}" if f.get("victim") else "", _took(f.get("recovery_s"), f.get("bound_s"))]
        out.bands.append(Band(start, max(end, start + INSTANT_S), label, "; ".join(b for b in bits if b)))
    for kind, count in (report.get("violations") or {}).items():
        out.verdicts.append(Verdict(kind, not count, f"{count} violation{'s' if count != 1 else ''}"))
    origin = _num(report.get("t_origin"))
    for e in report.get("events") or ():
        label = str(e.get("label") or e.get("kind") or "event")
        at, bound, worst = _num(e.get("at_s")), _num(e.get("bound_s")), _num(e.get("max_s"))
        if origin is not None and at is not None:
            until = _num(e.get("until_s"))
            out.bands.append(Band(origin + at, origin + max(until or at + INSTANT_S, at + INSTANT_S), label,
                                  _took(worst, bound)))
        pending = e.get("pending") or []
        ok = not pending and (bound is None or worst is None or worst <= bound)
        detail = _took(worst, bound) + (f"; {len(pending)} never done" if pending else "")
        out.verdicts.append(Verdict(label, ok, detail or "-"))
    if out.passed is not None:
        out.verdicts.insert(0, Verdict("the run as a whole", out.passed, "PASSED" if out.passed else "FAILED"))
    return out


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _took(worst: Any, bound: Any) -> str:
    worst, bound = _num(worst), _num(bound)
    if worst is None:
        return ""
    return f"took {worst:.2f} s" + (f" (bound {bound:.2f} s)" if bound is not None else "")
