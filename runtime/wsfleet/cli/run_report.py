"""``wsfleet report RUN_DIR``: one self-contained HTML file of what happened in a run (inline
SVG and CSS, no script, nothing fetched): the verdicts, a swimlane per connection (its
owners over time, one colour per worker; its sockets; fence changes; warnings), each
worker's load, and the faults as bands across both. From :mod:`.timeline` (the logs)
and :mod:`.run_verdicts` (the run's report.json, when it has one)."""

from __future__ import annotations

import datetime as dt
from html import escape
from pathlib import Path

from . import run_verdicts, svg, timeline
from .run_verdicts import Annotations, Band
from .timeline import PROCESS_GONE, STILL_HELD, Lane, Timeline

WIDTH = 1200
LABEL_W = 150  # the connection ids' column
RIGHT = 20
LANE_H = 16
LANE_GAP = 4
LABEL_ROWS = 3  # rows of fault labels above the lanes
LABEL_CHAR_W = 5.6  # about, at 10 px
TOP = 16 + 12 * LABEL_ROWS  # room for the fault labels
AXIS = 36
LOAD_H = 170
BAND_FILL = "#7f7f7f"  # grey: no worker's colour
GAP_STROKE = "#111111"  # black: no worker's colour either
MAX_LANES = 400  # a deployed fleet's thousands of connections: the first ones by id


def write(run_dir: Path | str, out: Path | str | None = None, *, max_lanes: int = MAX_LANES) -> Path:
    """Read ``run_dir``'s logs and report.json, write the HTML (``<run_dir>/report.html``
    unless ``out``) and return its path."""
    run_dir = Path(run_dir)
    html = page(timeline.read(run_dir), run_verdicts.read(run_dir), title=str(run_dir), max_lanes=max_lanes)
    path = Path(out) if out is not None else run_dir / "report.html"
    path.write_text(html, encoding="utf-8")
    return path


def _utc(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def colours(workers: list[str]) -> dict[str, str]:
    return {w: svg.colour(i) for i, w in enumerate(workers)}


def _x(t: Timeline) -> svg.Scale:
    return svg.Scale(0.0, max(t.end - t.start, 1.0), LABEL_W, WIDTH - RIGHT)


def _bands(t: Timeline, bands: list[Band], top: float, bottom: float, *, labels: bool) -> list[str]:
    x = _x(t)
    out = []
    ends = [0.0] * LABEL_ROWS  # where each row of labels is taken up to: faults close together stagger
    for b in sorted(bands, key=lambda b: b.start):
        x1, x2 = x(b.start - t.start), x(b.end - t.start)
        out.append(svg.rect(x1, top, x2 - x1, bottom - top, BAND_FILL, opacity=0.18,
                            title=f"{b.label}: {_utc(b.start)} for {b.end - b.start:.1f} s" + (f"; {b.detail}" if b.detail else "")))
        if labels:
            row = next((i for i, end in enumerate(ends) if end <= x1), min(range(LABEL_ROWS), key=ends.__getitem__))
            ends[row] = x1 + 2 + LABEL_CHAR_W * len(b.label) + 6
            out.append(svg.text(x1 + 2, top - 4 - row * 12, b.label, size=10, fill="#444"))
    return out


def lanes_svg(t: Timeline, bands: list[Band], *, max_lanes: int = MAX_LANES) -> str:
    """A lane per connection: owner periods (light, the worker's colour), sockets
    (solid), fence changes (a tick with the new fence), markers (triangles)."""
    shown = list(t.lanes.values())[:max_lanes]
    x = _x(t)
    height = TOP + len(shown) * (LANE_H + LANE_GAP) + AXIS
    bottom = height - AXIS
    y = svg.Scale(0, 1, bottom, TOP)
    hue = colours(t.workers)
    body = [*_bands(t, bands, TOP, bottom, labels=True),
            svg.axes(x, y, x_label=f"seconds from {_utc(t.start)}", grid=False, y_ticks=False)]
    for i, lane in enumerate(shown):
        body += _lane(lane, TOP + i * (LANE_H + LANE_GAP), x, t.start, hue)
    return svg.document(WIDTH, height, body, title="connections: owners over time")


def _lane(lane: Lane, top: float, x: svg.Scale, t0: float, hue: dict[str, str]) -> list[str]:
    out = [f"<g class='lane' data-connection='{escape(lane.connection_id, quote=True)}'>",
           svg.text(LABEL_W - 8, top + LANE_H - 4, lane.connection_id, anchor="end")]
    for p in lane.periods:
        x1, x2 = x(p.start - t0), x(p.end - t0)
        ending = {STILL_HELD: "still held at the end of the log", PROCESS_GONE: "process gone (no end logged)"}.get(p.why, p.why)
        out.append(svg.rect(x1, top, x2 - x1, LANE_H, hue.get(p.worker, "#999"), opacity=0.3,
                            title=f"{p.worker}, fence {p.fence} ({p.source or '?'}): {p.end - p.start:.1f} s, ended: {ending}"))
        out.append(svg.line(x1, top - 1, x1, top + LANE_H + 1, "#222", width=1.5))
        if x2 - x1 > 18:
            out.append(svg.text(x1 + 2, top + 9, f"f{p.fence}", size=8))
    for opened, closed, worker in lane.sockets:
        x1, x2 = x(opened - t0), x(closed - t0)
        out.append(svg.rect(x1, top + LANE_H * 0.55, x2 - x1, LANE_H * 0.35, hue.get(worker, "#999"),
                            title=f"socket of {worker}: {closed - opened:.1f} s"))
    for a, b in lane.gaps():
        x1, x2 = x(a - t0), x(b - t0)
        mid = top + LANE_H * 0.72
        out.append(svg.line(x1, mid, x2, mid, GAP_STROKE, width=2, dash="3,2", title=f"no socket for {b - a:.2f} s"))
    drawn = set()  # one marker per pixel and event: a flood of one warning is one mark, not thousands
    for m in lane.markers:
        px = x(m.ts - t0)
        if (round(px), m.event) in drawn:
            continue
        drawn.add((round(px), m.event))
        fill = "#d62728" if m.level == "error" else "#e6a700" if m.level == "warning" else "#555"
        out.append(svg.marker(px, top + 5, fill, title=f"{m.event} ({m.worker}) {m.detail}".strip()))
    out.append("</g>")
    return out


def load_svg(t: Timeline, bands: list[Band]) -> str:
    """Each worker's connections held over time (the ``active`` its lines carry)."""
    x = _x(t)
    top, bottom = 20, LOAD_H - AXIS
    most = max((a for series in t.load.values() for _, a in series), default=1)
    y = svg.Scale(0, max(most, 1), bottom, top)
    hue = colours(t.workers)
    body = [*_bands(t, bands, top, bottom, labels=False),
            svg.axes(x, y, x_label=f"seconds from {_utc(t.start)}", y_label="held")]
    for worker in t.workers:
        series = t.load.get(worker, [])
        if not series:
            continue
        points, level = [], None
        for ts, active in series:
            px = x(ts - t.start)
            if level is not None:
                points.append((px, y(level)))
            points.append((px, y(active)))
            level = active
        body.append(svg.polyline(points, hue[worker], title=f"{worker}: connections held"))
    return svg.document(WIDTH, LOAD_H, body, title="workers: connections held")


CSS = """
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: left; border-bottom: 1px solid #eee; }
.ok { color: #2a7d2a; font-weight: bold; } .bad { color: #c0392b; font-weight: bold; }
.swatch { display: inline-block; width: 12px; height: 10px; margin: 0 4px 0 12px; }
.note { color: #555; }
"""


def page(t: Timeline, notes: Annotations, *, title: str, max_lanes: int = MAX_LANES) -> str:
    """The whole page; well-formed XML too (an XML parser reads it, as the tests do)."""
    hue = colours(t.workers)
    rows = "".join(
        f"<tr><td>{escape(v.name)}</td><td class='{'ok' if v.ok else 'bad'}'>{'ok' if v.ok else 'VIOLATED'}</td>"
        f"<td>{escape(v.detail)}</td></tr>"
        for v in notes.verdicts
    )
    verdict = ("<p class='note'>nothing judged this run</p>" if not rows
               else f"<table class='verdicts'><tr><th>check</th><th>verdict</th><th>detail</th></tr>{rows}</table>")
    legend = "".join(f"<span class='swatch' style='background:{c}'></span>{escape(w)}" for w, c in hue.items())
    lanes = len(t.lanes)
    cut = f" (the first {max_lanes} of {lanes} by id)" if lanes > max_lanes else ""
    overlaps = sum(lane.overlaps() for lane in t.lanes.values())
    gaps = [b - a for lane in t.lanes.values() for a, b in lane.gaps()]
    facts = [
        f"{_utc(t.start)} to {_utc(t.end)} ({t.end - t.start:.0f} s)",
        f"{len(t.workers)} workers, {lanes} connections, {sum(len(lane.periods) for lane in t.lanes.values())} owner periods",
        f"{len(gaps)} socket gaps" + (f", longest {max(gaps):.2f} s" if gaps else ""),
        f"{overlaps} moments two workers' logs both claimed a connection" if overlaps else "",
        f"{t.lines} log lines from {t.files} files" + (f", {t.skipped} other lines skipped" if t.skipped else ""),
        *notes.notes,
    ]
    return "".join([
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'/>",
        f"<title>wsfleet run: {escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>wsfleet run: {escape(title)}</h1>",
        "<ul>", *(f"<li>{escape(f)}</li>" for f in facts if f), "</ul>",
        "<h2>Verdicts</h2>", verdict,
        f"<h2>Connections: owners over time{escape(cut)}</h2>",
        "<p class='note'>Each lane is a connection. Light bar: a worker's ownership (from lease_acquired to "
        "connection_ended; the tick and fN mark a new fence); solid bar: its socket; dashed black: no socket; triangles: warnings "
        "(yellow), errors (red) and STOPs, releases, moves (grey); grey bands: faults. Hover for details. Times are each "
        "worker's own clock (its lines' ts): a worker whose clock is off draws off by as much.</p>",
        f"<p>{legend}</p>",
        lanes_svg(t, notes.bands, max_lanes=max_lanes),
        "<h2>Workers: connections held</h2>", load_svg(t, notes.bands),
        "</body></html>\n",
    ])
