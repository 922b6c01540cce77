"""``wsfleet plan --chart FILE.svg``: the plan from 1,000 to 1,000,000 connections at a
glance. Three panels on one log axis of connections: the workers target tracking runs,
the $ per month, and each limit's use of its headroom (needed / available, 1 = the
limit binds), with the first limit that binds marked across all three. Every point is
:func:`wsfleet.plan.limits.evaluate` at that size, the function the table comes from."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from . import svg

LO, HI = 1_000, 1_000_000
STEPS_PER_DECADE = 8
WIDTH = 960
PLOT_L, PLOT_R = 90, WIDTH - 30
PANEL_H = 150
PANEL_GAP = 56
SHOWN_LIMITS = 8  # the limits that come nearest to binding over the range; the rest are listed as fewer
USE_FLOOR = 1e-3  # uses below a thousandth of their limit sit on the axis


def points() -> list[int]:
    """Connections at which the plan is evaluated: log-spaced from LO to HI."""
    decades = 3
    return [round(LO * 10 ** (i / STEPS_PER_DECADE)) for i in range(decades * STEPS_PER_DECADE + 1)]


def crossing(values: list[tuple[int, float]]) -> float | None:
    """Where a use first reaches 1 (log-interpolated between the points), LO if it is
    there from the start, None if never within the range."""
    if values and values[0][1] > 1:
        return float(values[0][0])
    for (n1, u1), (n2, u2) in zip(values, values[1:], strict=False):
        if u1 <= 1 < u2:
            if u1 <= 0 or u2 == math.inf:
                return float(n2)
            share = -math.log10(u1) / (math.log10(u2) - math.log10(u1))
            return 10 ** (math.log10(n1) + share * (math.log10(n2) - math.log10(n1)))
    return None


def series(evaluate: Callable[[int], Mapping[str, Any]]) -> dict[str, Any]:
    """Workers, $ per month and every limit's use at each of :func:`points`, and which
    limit binds first and where. ``evaluate(connections)``: the plan at that size."""
    plans = [(n, evaluate(n)) for n in points()]
    uses: dict[str, list[tuple[int, float]]] = {}
    for n, plan in plans:
        for lim in plan["limits"]:
            name = f"{lim['name']} ({lim['scenario']})"
            uses.setdefault(name, []).append((n, lim["used"] / lim["limit"] if lim["limit"] else math.inf))
    binds = {name: at for name in uses if (at := crossing(uses[name])) is not None}
    first = min(binds, key=lambda name: (binds[name], -uses[name][-1][1]), default=None)
    ranked = sorted(uses, key=lambda name: -max(u for _, u in uses[name]))
    shown = ranked[:SHOWN_LIMITS]
    if first is not None and first not in shown:
        shown[-1] = first
    return {
        "workers": [(n, p["workers"]) for n, p in plans],
        "usd_per_month": [(n, p["usd_per_month"]) for n, p in plans],
        "limits": {name: uses[name] for name in shown},
        "binds_at": {name: binds[name] for name in shown if name in binds},
        "limits_not_shown": len(uses) - len(shown),
        "first": None if first is None else {"connections": binds[first], "limit": first},
    }


def _panel(top: float, title: str, values: list[tuple[int, float]], colour: str, y_label: str,
           fmt: Callable[[float], str] = svg.number) -> tuple[list[str], svg.Scale]:
    x = svg.Scale(LO, HI, PLOT_L, PLOT_R, log=True)
    lo = max(min(v for _, v in values), 1e-9)
    hi = max(max(v for _, v in values), lo * 10)
    y = svg.Scale(10 ** _floor_log(lo), 10 ** _ceil_log(hi), top + PANEL_H, top, log=True)
    body = [svg.text(PLOT_L, top - 8, title, bold=True), svg.axes(x, y, y_label=y_label, y_format=fmt),
            svg.polyline([(x(n), y(v)) for n, v in values], colour, width=2, title=title)]
    return body, y


def _floor_log(v: float) -> int:
    return math.floor(math.log10(v))


def _ceil_log(v: float) -> int:
    return math.ceil(math.log10(v))


def chart(s: Mapping[str, Any], *, title: str, asked: int | None = None) -> str:
    """The SVG of :func:`series`; ``asked``: the plan's own --connections, marked."""
    x = svg.Scale(LO, HI, PLOT_L, PLOT_R, log=True)
    body = [svg.text(PLOT_L, 18, title, size=13, bold=True)]
    top = 74
    part, _ = _panel(top, "workers (target tracking)", s["workers"], svg.colour(0), "tasks")
    body += part
    top += PANEL_H + PANEL_GAP
    part, _ = _panel(top, "$ per month (us-east-1 list prices)", s["usd_per_month"], svg.colour(1), "$ / month",
                     lambda v: "$" + svg.number(v))
    body += part
    top += PANEL_H + PANEL_GAP
    uses = s["limits"]
    most = max([1.0, *(u for values in uses.values() for _, u in values if u != float("inf"))])
    y = svg.Scale(USE_FLOOR, 10 ** _ceil_log(most * 1.5), top + PANEL_H * 1.6, top, log=True)
    body += [svg.text(PLOT_L, top - 8, "each limit: needed / available (above 1: it binds)", bold=True),
             svg.axes(x, y, x_label="connections (log scale)", y_label="needed / available",
                      y_format=lambda v: f"{v:g}"),
             svg.line(PLOT_L, y(1), PLOT_R, y(1), "#c0392b", width=1.5, dash="5,3"),
             svg.text(PLOT_L + 4, y(1) - 4, "limit", fill="#c0392b")]
    for i, (name, values) in enumerate(uses.items()):
        body.append(svg.polyline([(x(n), y(max(min(u, 1e9), USE_FLOOR))) for n, u in values], svg.colour(i + 2),
                                 title=name))
        if name in s["binds_at"]:
            at = s["binds_at"][name]
            body.append(svg.dot(x(at), y(1), svg.colour(i + 2), title=f"{name}: binds at about {at:,.0f} connections"))
    bottom = top + PANEL_H * 1.6
    legend_top = bottom + 52
    body.append(svg.legend(PLOT_L, legend_top, [(name, svg.colour(i + 2)) for i, name in enumerate(uses)]))
    rows = len(uses)
    if s["limits_not_shown"]:
        body.append(svg.text(PLOT_L, legend_top + rows * 15, f"and {s['limits_not_shown']} limits further from binding"
                             " (wsfleet plan lists them all)", fill="#555"))
        rows += 1
    if s["first"]:
        n = s["first"]["connections"]
        where = f"already at {LO:,}" if n <= LO else f"from about {float(f'{n:.2g}'):,.0f}"
        right = x(n) > WIDTH / 2
        body += [svg.line(x(n), 44, x(n), bottom, "#c0392b", width=1.5, dash="2,2"),
                 svg.text(x(n) + (-4 if right else 4), 40, f"first limit to bind: {s['first']['limit']}, {where} connections",
                          fill="#c0392b", anchor="end" if right else "start")]
    else:
        body.append(svg.text(PLOT_L, 40, f"no limit binds from {LO:,} to {HI:,} connections", fill="#2a7d2a"))
    if asked and LO <= asked <= HI:
        body += [svg.line(x(asked), 44, x(asked), bottom, "#222", dash="6,3"),
                 svg.text(x(asked) + 3, bottom - 4, f"--connections {asked:,}", size=10)]
    height = legend_top + rows * 15 + 10
    return svg.document(WIDTH, height, body, title=title)
