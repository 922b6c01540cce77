"""A few drawing words for the operators' pictures (the run report, the plan's chart, the
benchmarks' charts): scales, axes, lines, bands, text. Each returns SVG markup as a
string; :func:`document` wraps them in a standalone ``<svg>``. No I/O, no library: the
pictures must open in a browser with no network, and the worker image ships none of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence
from xml.sax.saxutils import escape

NS = "http://www.w3.org/2000/svg"
FONT = "font-family='system-ui, sans-serif' font-size='11'"
# Distinct colours for workers, sinks, limits: the Tableau 10 hues (a palette, not code).
PALETTE = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)


def colour(n: int) -> str:
    """The ``n``-th colour; past the palette, hues around the wheel."""
    if n < len(PALETTE):
        return PALETTE[n]
    return f"hsl({(n * 137) % 360},55%,55%)"


@dataclass(frozen=True)
class Scale:
    """Maps ``lo..hi`` onto the pixels ``a..b`` (``b < a`` for a y axis), linearly or by
    logarithm (``log``: both ends must be above 0)."""

    lo: float
    hi: float
    a: float
    b: float
    log: bool = False

    def __call__(self, v: float) -> float:
        if self.log:
            lo, hi, v = math.log10(self.lo), math.log10(self.hi), math.log10(max(v, self.lo / 10))
        else:
            lo, hi = self.lo, self.hi
        span = (hi - lo) or 1.0
        return round(self.a + (v - lo) / span * (self.b - self.a), 2)

    def ticks(self, most: int = 6) -> list[float]:
        if self.log:
            first, last = math.floor(math.log10(self.lo)), math.ceil(math.log10(self.hi))
            return [10.0**e for e in range(first, last + 1) if self.lo <= 10.0**e <= self.hi]
        span = self.hi - self.lo
        if span <= 0:
            return [self.lo]
        raw = span / most
        step = 10 ** math.floor(math.log10(raw))
        step *= next(m for m in (1, 2, 5, 10) if span / (step * m) <= most)
        start = math.ceil(self.lo / step) * step
        return [round(start + i * step, 10) for i in range(int((self.hi - start) / step + 1e-9) + 1)]


def number(v: float) -> str:
    """A tick label: 1k, 250k, 1M, 0.5, 12."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def text(x: float, y: float, words: str, *, anchor: str = "start", size: int | None = None, bold: bool = False,
         fill: str = "#222", rotate: bool = False) -> str:
    extra = (f" font-size='{size}'" if size else "") + (" font-weight='bold'" if bold else "")
    turn = f" transform='rotate(-90 {x} {y})'" if rotate else ""
    return f"<text x='{x}' y='{y}' text-anchor='{anchor}' fill='{fill}'{extra}{turn}>{escape(words)}</text>"


def rect(x: float, y: float, w: float, h: float, fill: str, *, title: str = "", opacity: float = 1.0,
         stroke: str = "none") -> str:
    tip = f"<title>{escape(title)}</title>" if title else ""
    op = f" fill-opacity='{opacity}'" if opacity != 1.0 else ""
    return (f"<rect x='{x}' y='{y}' width='{max(w, 0.5):.2f}' height='{h}' fill='{fill}' stroke='{stroke}'{op}>"
            f"{tip}</rect>")


def line(x1: float, y1: float, x2: float, y2: float, stroke: str = "#999", *, width: float = 1, dash: str = "",
         title: str = "") -> str:
    d = f" stroke-dasharray='{dash}'" if dash else ""
    head = f"<line x1='{x1}' y1='{y1}' x2='{x2}' y2='{y2}' stroke='{stroke}' stroke-width='{width}'{d}"
    return f"{head}><title>{escape(title)}</title></line>" if title else head + "/>"


def polyline(points: Iterable[tuple[float, float]], stroke: str, *, width: float = 1.5, title: str = "",
             dash: str = "") -> str:
    pts = " ".join(f"{x:.2f},{y:.2f}" for x, y in points)
    tip = f"<title>{escape(title)}</title>" if title else ""
    d = f" stroke-dasharray='{dash}'" if dash else ""
    return f"<polyline points='{pts}' fill='none' stroke='{stroke}' stroke-width='{width}'{d}>{tip}</polyline>"


def marker(x: float, y: float, fill: str, *, title: str = "", size: float = 4) -> str:
    """A small triangle pointing down at ``(x, y)``, with a tooltip."""
    tip = f"<title>{escape(title)}</title>" if title else ""
    pts = f"{x - size},{y - size * 1.6} {x + size},{y - size * 1.6} {x},{y}"
    return f"<polygon points='{pts}' fill='{fill}'>{tip}</polygon>"


def dot(x: float, y: float, fill: str, *, title: str = "", r: float = 4) -> str:
    tip = f"<title>{escape(title)}</title>" if title else ""
    return f"<circle cx='{x}' cy='{y}' r='{r}' fill='{fill}' stroke='white'>{tip}</circle>"


def axes(x: Scale, y: Scale, *, x_label: str = "", y_label: str = "", x_format=number, y_format=number,
         grid: bool = True, y_ticks: bool = True) -> str:
    """Both axes with their ticks and labels (and light grid lines) around the plot
    area the two scales span; ``y_ticks=False``: the y axis a bare line."""
    left, right = min(x.a, x.b), max(x.a, x.b)
    top, bottom = min(y.a, y.b), max(y.a, y.b)
    out = [line(left, bottom, right, bottom, "#444"), line(left, top, left, bottom, "#444")]
    for t in x.ticks():
        px = x(t)
        if grid:
            out.append(line(px, top, px, bottom, "#eee"))
        out += [line(px, bottom, px, bottom + 4, "#444"), text(px, bottom + 15, x_format(t), anchor="middle")]
    for t in y.ticks() if y_ticks else ():
        py = y(t)
        if grid:
            out.append(line(left, py, right, py, "#eee"))
        out += [line(left - 4, py, left, py, "#444"), text(left - 6, py + 4, y_format(t), anchor="end")]
    if x_label:
        out.append(text((left + right) / 2, bottom + 32, x_label, anchor="middle"))
    if y_label:
        out.append(text(left - 44, (top + bottom) / 2, y_label, anchor="middle", rotate=True))
    return "".join(out)


def legend(x: float, y: float, entries: Sequence[tuple[str, str]], *, row: float = 15) -> str:
    """A column of colour swatches with their names, from ``(x, y)`` down."""
    return "".join(
        rect(x, y + i * row - 9, 12, 10, fill) + text(x + 17, y + i * row, name) for i, (name, fill) in enumerate(entries)
    )


def document(width: float, height: float, body: str | Iterable[str], *, title: str = "") -> str:
    """A standalone SVG document (the XML declaration left out: it may sit inside HTML)."""
    parts = body if isinstance(body, str) else "".join(body)
    head = f"<title>{escape(title)}</title>" if title else ""
    return (f"<svg xmlns='{NS}' width='{width:.0f}' height='{height:.0f}' viewBox='0 0 {width:.0f} {height:.0f}' "
            f"{FONT}>{head}<rect width='100%' height='100%' fill='white'/>{parts}</svg>")
