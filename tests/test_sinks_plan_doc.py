"""BENCHMARKS.md's "Sinks: what each costs (plan)" table is the plan's output
(bench/sinks_plan.py writes it): this fails when the plan's sink prices, its settings or
measured_ops.json change and the table was not rewritten (`python -m bench.sinks_plan`)."""

from __future__ import annotations

from bench import sinks_plan


def test_benchmarks_sinks_plan_table_is_what_the_plan_prints_today():
    text = sinks_plan.BENCHMARKS_MD.read_text()
    assert sinks_plan.current_table(text) == sinks_plan.table(), "run: PYTHONPATH=runtime:. python -m bench.sinks_plan"


def test_the_table_is_replaced_between_its_markers_and_nothing_else_moves():
    text = "#### Sinks\n\nintro:\n\n<!-- sinks-plan -->\n| old |\n<!-- /sinks-plan -->\n\n- prose\n"
    new = sinks_plan.replace_table(text, "| new |\n")
    assert new == "#### Sinks\n\nintro:\n\n<!-- sinks-plan -->\n| new |\n<!-- /sinks-plan -->\n\n- prose\n"
    assert sinks_plan.current_table(new) == "| new |\n"


def test_a_price_is_the_plans_own_json():
    # 1,000 connections receiving nothing: the same holding cost under every sink but
    # the stream's fixed charges.
    assert sinks_plan.price(1_000, 0, "dynamodb") < sinks_plan.price(1_000, 0, "kinesis")
