"""The spans a traced local run wrote (``make demo TRACING=otel``): every process's OTLP
JSON lines, ``traces-<name>.jsonl`` in the run directory, read back as span trees.

    python -m sim.traces .demo/<run>                 # one line per trace
    python -m sim.traces .demo/<run> 1-6565e1a0-...  # that trace as a tree

A trace id is printed in X-Ray's form, as the log lines' ``trace_id`` has it.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence


@dataclass
class Span:
    trace_id: str  # X-Ray form: 1-xxxxxxxx-xxxxxxxxxxxxxxxxxxxxxxxx
    span_id: str
    parent_id: str
    name: str
    service: str
    start_ns: int
    end_ns: int
    attributes: dict = field(default_factory=dict)


def xray_id(hex_id: str) -> str:
    return f"1-{hex_id[:8]}-{hex_id[8:]}"


def read(run_dir: Path | str) -> list[Span]:
    """Every span of every ``traces-*.jsonl`` in ``run_dir``; a line cut short by a kill
    is skipped."""
    spans = []
    for path in sorted(Path(run_dir).glob("traces-*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                spans.extend(_spans(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                continue
    return spans


def _spans(batch: dict) -> Iterable[Span]:
    for resource in batch["resourceSpans"]:
        attrs = _attributes(resource.get("resource", {}).get("attributes", []))
        for scope in resource.get("scopeSpans", []):
            for s in scope.get("spans", []):
                yield Span(
                    xray_id(s["traceId"]), s["spanId"], s.get("parentSpanId", ""), s["name"],
                    str(attrs.get("service.name", "")), int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]),
                    _attributes(s.get("attributes", [])),
                )


def _attributes(pairs: list) -> dict:
    return {p["key"]: next(iter(p["value"].values()), None) for p in pairs if p.get("value")}


def by_trace(spans: Sequence[Span]) -> dict[str, list[Span]]:
    traces: dict[str, list[Span]] = defaultdict(list)
    for span in spans:
        traces[span.trace_id].append(span)
    return dict(traces)


def tree(spans: Sequence[Span]) -> list[str]:
    """One trace's spans as indented lines, children under their parent in start order
    (a span whose parent is in no file, such as the Lambda's, starts a root)."""
    ids = {s.span_id for s in spans}
    children: dict[str, list[Span]] = defaultdict(list)
    for span in spans:
        children[span.parent_id if span.parent_id in ids else ""].append(span)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for span in sorted(children[parent], key=lambda s: s.start_ns):
            attrs = " ".join(f"{k}={v}" for k, v in sorted(span.attributes.items()))
            took = (span.end_ns - span.start_ns) / 1e6
            lines.append(f"{'  ' * depth}{span.name} [{span.service}] {took:.1f} ms {attrs}".rstrip())
            walk(span.span_id, depth + 1)

    walk("", 0)
    return lines


def summary(spans: Sequence[Span]) -> list[str]:
    """One line per trace: its first span, its size and its own (not AWS call) span names."""
    out = []
    for trace_id, members in sorted(by_trace(spans).items(), key=lambda kv: min(s.start_ns for s in kv[1])):
        first = min(members, key=lambda s: s.start_ns)
        names = sorted({s.name for s in members if "." not in s.name})
        out.append(f"{trace_id} {len(members)} spans from {first.name}: {', '.join(names)}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or len(args) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    spans = read(args[0])
    if not spans:
        print(f"no spans in {args[0]}/traces-*.jsonl (run the demo with TRACING=otel)", file=sys.stderr)
        return 1
    if len(args) == 2:
        members = by_trace(spans).get(args[1], [])
        if not members:
            print(f"no trace {args[1]} in {args[0]}", file=sys.stderr)
            return 1
        print("\n".join(tree(members)))
    else:
        print("\n".join(summary(spans)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
