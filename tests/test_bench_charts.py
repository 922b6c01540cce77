"""BENCHMARKS.md's charts: drawn from a benchmark's raw results, well-formed, and the ones
the file embeds are there."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from bench import charts
from bench.generated import BENCHMARKS_MD

SVG = "{http://www.w3.org/2000/svg}"


def titles(root: ET.Element, tag: str) -> list[str]:
    return [e.findtext(f"{SVG}title") or "" for e in root.iter(f"{SVG}{tag}")]


def test_the_failover_chart_draws_a_line_per_measure_and_kind_from_the_raw_results():
    results = {"results": [
        {"crashes": [{"socket_s": {"c1": 10.2, "c2": 11.1, "c3": None}}],
         "handoffs": [{"no_socket_s": {"c1": 0.21, "c2": 0.4}}]},
        {"kind": "authenticated", "crashes": [{"socket_s": {"c1": 10.9}}], "handoffs": [{"no_socket_s": {}}]},
    ]}
    root = ET.fromstring(charts.failover_gaps(results, "a test"))
    lines = titles(root, "polyline")
    assert lines == ["crash: kill -9 -> new socket: n=2, max 11.10 s", "handoff: no socket: n=2, max 0.40 s",
                     "crash: kill -9 -> new socket, auth + subscribe: n=1, max 10.90 s"]


def test_the_memory_chart_draws_the_recorded_figures():
    root = ET.fromstring(charts.rss_by_frame_size(charts.RECORDED["largeframes"], "recorded"))
    dots = titles(root, "circle")
    assert "16 connections, budget off: 3112 MB (stopped at the RSS cap)" in dots
    assert "33,554,432 B frames: 324 MB" in dots


def test_benchmarks_md_embeds_every_chart_and_each_is_well_formed_svg():
    embedded = re.findall(r"\]\((bench/charts/[\w.-]+\.svg)\)", BENCHMARKS_MD.read_text())
    on_disk = sorted(p.name for p in charts.CHARTS.glob("*.svg"))
    assert sorted(p.rsplit("/", 1)[1] for p in embedded) == on_disk == sorted(charts.NAMES)
    for name in on_disk:
        assert ET.parse(charts.CHARTS / name).getroot().tag == f"{SVG}svg"


def test_the_readmes_charts_are_benchmarks_own():
    readme = BENCHMARKS_MD.with_name("README.md").read_text()
    embedded = re.findall(r"\]\((bench/charts/[\w.-]+\.svg)\)", readme)
    assert embedded and all((charts.CHARTS.parent.parent / path).is_file() for path in embedded)
    assert {p.rsplit("/", 1)[1] for p in embedded} <= set(charts.NAMES)
