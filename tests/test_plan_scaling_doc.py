"""BENCHMARKS.md's Scaling section is the plan's output (bench/scaling.py writes it):
this fails when the plan's arithmetic, its settings or measured_ops.json change and
the section was not rewritten (`python -m bench.scaling`)."""

from __future__ import annotations

from bench import scaling


def test_benchmarks_scaling_section_is_what_the_plan_prints_today():
    text = scaling.BENCHMARKS_MD.read_text()
    assert scaling.current_section(text) == scaling.section(), "run: PYTHONPATH=runtime:. python -m bench.scaling"


def test_the_section_is_replaced_in_place_and_nothing_else_moves():
    text = "# B\n\nintro\n\n## Scaling\n\nold table\n\n## How each figure is measured\n\nrest\n"
    new = scaling.replace_section(text, "## Scaling\n\nnew\n\n")
    assert new == "# B\n\nintro\n\n## Scaling\n\nnew\n\n## How each figure is measured\n\nrest\n"
    assert scaling.current_section(new) == "## Scaling\n\nnew\n\n"
