"""`wsfleet plan`'s ways to keep the messages (wsfleet.plan.modes): the table on-demand and
provisioned, the stream on-demand and provisioned, Firehose to S3; what an environment
deploys; the cheapest that holds. prod at 500,000 connections of 0.5 msg/s of 200-byte
frames is the case the targets are set for ($ per 1,000 connections a month: a stream and
Firehose at most 40, the table at most 250, which no table mode meets: docs/scaling.md,
"The messages at 500,000", says why)."""

from __future__ import annotations

import json
import math

import pytest

from wsfleet.cli import main
from wsfleet.plan import environments, model, modes
from wsfleet.plan import sinks as plan_sinks
from wsfleet.plan.firehose import ingest_dollars
from wsfleet.plan.prices import DYNAMODB_PROVISIONED_PRICES, FIREHOSE_RECORD_ROUNDING_BYTES, KINESIS_PROVISIONED_PRICES

MONTH_H = 730


@pytest.fixture(scope="module")
def prod_500k() -> dict:
    """`wsfleet plan --env prod --connections 500000 --rate 0.5 --frame-bytes 200 --json`."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--env", "prod", "--connections", "500000", "--rate", "0.5", "--frame-bytes", "200",
                     "--json"], env={}) == 0
    return json.loads(out.getvalue())


def _by_mode(result: dict) -> dict:
    return {m["mode"]: m for m in result["modes"]["modes"]}


def _sinks(connections: int = 500_000, rate: float = 0.5, per_worker: int = 1690, flush_ms: int = 100,
           ttl_days: float = 30) -> dict:
    return plan_sinks.sinks(model.load_measured(), connections=connections, per_worker=per_worker, rate=rate,
                            shards=16, checkpoint_s=120, ttl_days=ttl_days, frame_bytes=200, flush_ms=flush_ms)


def test_prod_at_500k_prices_every_mode_and_the_stream_and_firehose_meet_their_targets(prod_500k):
    got = {name: m["per_1000_connections"] for name, m in _by_mode(prod_500k).items()}
    assert set(got) == {"table_on_demand", "table_provisioned", "stream_on_demand", "stream_provisioned", "firehose"}
    assert got["stream_provisioned"] <= 40 and got["firehose"] <= 40
    # The figures as the plan prints them (their arithmetic is checked below, mode by mode).
    assert got["stream_provisioned"] == pytest.approx(25.60, abs=0.01)
    assert got["firehose"] == pytest.approx(31.03, abs=0.01)  # its objects kept GZIP'd, 2 times smaller
    assert got["stream_on_demand"] == pytest.approx(146.81, abs=0.01)  # 0.975 KB billed per frame, in and out


def test_no_table_mode_meets_250_at_prods_500k_and_the_figures_say_why(prod_500k):
    # One item (one write unit) per frame: 500 frames/s per 1,000 connections is 500 WCU,
    # $237 a month at a provisioned unit's list price even fully used; at 70 % and with
    # 30 days of items stored (about $138), the provisioned table is about 478.
    by = _by_mode(prod_500k)
    floor = 500 * DYNAMODB_PROVISIONED_PRICES["wcu_hour"] * MONTH_H
    assert floor == pytest.approx(237.25)
    assert by["table_provisioned"]["per_1000_connections"] == pytest.approx(478.01, abs=0.01)
    assert by["table_on_demand"]["per_1000_connections"] == pytest.approx(959.15, abs=0.01)
    assert by["table_provisioned"]["month"]["storage"] / 500 == pytest.approx(137.9, abs=0.1)
    assert min(by["table_provisioned"]["per_1000_connections"], by["table_on_demand"]["per_1000_connections"]) > 250


def test_the_plan_recommends_the_cheapest_mode_that_holds_and_says_why_in_one_sentence(prod_500k):
    r = prod_500k["modes"]["recommended"]
    cheapest = min((m for m in prod_500k["modes"]["modes"] if m["holds"]), key=lambda m: m["month"]["total"])
    assert r["mode"] == cheapest["mode"] == "stream_provisioned"
    assert r["why"].startswith("stream, provisioned: the cheapest of the 5 ways to keep the messages that hold at "
                               "250,000 messages/s, $25.60 per 1,000 connections a month")
    assert "Firehose to S3" in r["why"] and "\n" not in r["why"] and r["why"].count(". ") == 0


def test_json_shape_and_one_monthly_total_with_the_messages_as_prod_deploys_them(prod_500k):
    c = prod_500k["modes"]
    for m in c["modes"]:
        assert {"mode", "label", "sink", "capacity", "month", "per_1000_connections", "checks", "holds", "over",
                "raise_first"} <= set(m)
        assert m["month"]["total"] == pytest.approx(sum(v for k, v in m["month"].items() if k != "total"))
    # prod's file: sink "dynamodb", no messages_capacity: the table on-demand.
    assert c["deployed"]["modes"] == ["table_on_demand"] and c["deployed"]["holds"]
    month = prod_500k["month"]
    assert month["messages"] == pytest.approx(c["deployed"]["total"])
    assert prod_500k["usd_per_month"] == pytest.approx(month["total"])
    assert month["total"] == pytest.approx(sum(v for k, v in month.items() if k != "total"))


def test_provisioned_shards_come_from_the_packed_records_and_bytes_at_70_percent():
    p = _sinks()
    k = p["packing"]["kinesis"]
    records_s, bytes_s = 250_000 * k["records_per_message"], 250_000 * k["bytes_per_message"]
    s = modes.stream_provisioned(p, shards=None, kms=0.0)
    # Records bind: ~243,750 a second of ~430 bytes need 244 shards by records, 102 by bytes.
    assert s["shards"] == math.ceil(max(records_s / 1000, bytes_s / (1 << 20)) / 0.7) == 349
    assert s["month"]["shards"] == pytest.approx(349 * KINESIS_PROVISIONED_PRICES["shard_hour"] * MONTH_H)
    # Each record under 25 KB: one PUT payload unit.
    assert s["put_payload_units_per_record"] == 1
    assert s["month"]["put_payload_units"] == pytest.approx(records_s * 730 * 3600 / 1e6 * 0.014)
    assert s["month"]["retention"] == 0  # 24 h


def test_a_longer_flush_packs_more_frames_a_record_and_the_provisioned_stream_needs_fewer_shards():
    short, long = (modes.stream_provisioned(_sinks(flush_ms=ms, per_worker=70), shards=None, kms=0.0)
                   for ms in (100, 5000))
    assert long["records_per_s"] < 0.5 * short["records_per_s"]
    assert long["shards"] < short["shards"] and long["month"]["total"] < short["month"]["total"]


def test_firehose_records_are_a_workers_flush_and_each_is_billed_in_whole_5_kb():
    p = _sinks()
    f = modes.firehose(p)
    assert f["calls_per_s"] == pytest.approx(296 / 0.1)  # one PutRecordBatch per worker per flush
    billed_record = f["billed_bytes_per_message"] * 250_000 / (f["calls_per_s"])
    # each record rounded up to whole 5 KB: the mean record is billed at most 5 KB over its size
    assert f["record_bytes"] <= billed_record < f["record_bytes"] + FIREHOSE_RECORD_ROUNDING_BYTES
    # A worker's 84.5 frames of 382 bytes a flush make a 32 KB record: the rounding adds under 16 %.
    assert f["billed_bytes_per_message"] < 1.16 * f["record_bytes"] / (250_000 / f["calls_per_s"])
    # Small flushes round worse: one frame a record would bill 5 KB a frame.
    few = modes.firehose(_sinks(connections=1000, per_worker=10))
    assert few["billed_bytes_per_message"] > 5 * f["billed_bytes_per_message"]
    # prod's 101 MB/s and 2,960 calls/s are over a delivery stream's default quotas: raise them first.
    assert f["holds"] and {"a delivery stream's writes", "a delivery stream's calls"} <= set(f["raise_first"])


def test_firehose_ingestion_is_priced_by_its_monthly_tiers():
    tb = 1024  # GB
    assert ingest_dollars(100 * tb) == pytest.approx(100 * tb * 0.029)
    assert ingest_dollars(600 * tb) == pytest.approx(500 * tb * 0.029 + 100 * tb * 0.025)


def test_the_modes_and_the_sinks_price_the_delivery_stream_alike():
    # One model of Firehose (plan.firehose): the plan's modes and its per-sink table show one figure.
    p = _sinks()
    assert modes.firehose(p)["month"]["total"] == pytest.approx(p["firehose"]["month"]["total"])
    assert p["sinks"]["firehose"]["month"]["firehose"] == pytest.approx(p["firehose"]["month"]["total"])


def test_a_mode_over_a_hard_limit_is_ruled_out_and_the_sentence_says_which():
    # 2,000 frames/s of 1,000 bytes on one connection: over its shard's 1 MB/s (packed or
    # not) and its table partition's 1,000 write units; Firehose takes it.
    p = plan_sinks.sinks(model.load_measured(), connections=100, per_worker=70, rate=2000, shards=4, checkpoint_s=120,
                         ttl_days=3, frame_bytes=1000)
    c = modes.compare(p, environments.load("dev"), wru_per_million=0.625, table_quota=40_000)
    held = {m["mode"] for m in c["modes"] if m["holds"]}
    assert held == {"firehose"}
    assert c["recommended"]["mode"] == "firehose"
    assert "stream, provisioned does not hold (one connection's shard)" in c["recommended"]["why"]


def test_what_an_environment_deploys_is_priced_as_set_and_over_when_its_settings_are_short():
    p = _sinks()
    settings = {"sink": "dynamodb,kinesis", "stream_mode": "provisioned", "stream_shards": 100,
                "messages_capacity": {**environments.MESSAGES_CAPACITY_DEFAULTS, "billing": "provisioned",
                                      "max_write_units": 100_000}}
    d = modes.deployed(p, settings, wru_per_million=0.625, table_quota=400_000)
    assert d["modes"] == ["table_provisioned", "stream_provisioned"] and not d["holds"]
    assert "messages_capacity.max_write_units" in d["over"] and "stream_shards (the environment's)" in d["over"]
    # A crash's takeovers read 12,500 stored ends a second: 6,250 read units, not the default 5.
    assert "messages_capacity.min_read_units (a crash's takeover reads)" in d["over"]
    table, stream = d["parts"]
    assert stream["shards"] == 100  # priced at what it deploys
    assert table["write_units"] == 100_000
    assert d["total"] == pytest.approx(table["month"]["total"] + stream["month"]["total"])


def test_the_plan_in_tables_shows_each_mode_the_environments_and_the_recommendation(capsys):
    assert main(["plan", "--env", "prod", "--connections", "500000", "--rate", "0.5", "--frame-bytes", "200"],
                env={}) == 0
    out = capsys.readouterr().out
    assert "stream, provisioned  12,802" in out and "349 shards (349 needed)" in out
    assert "this environment deploys table, on-demand: 479,575 $ a month, 959.15 per 1,000 connections" in out
    assert "\nrecommended: stream, provisioned: the cheapest of the 5 ways" in out
    assert "the messages as deployed (table, on-demand) 479,575)" in out
    assert "e+0" not in out


def test_docs_scaling_shows_the_modes_as_the_plan_prints_them_today(capsys):
    from pathlib import Path

    assert main(["plan", "--env", "prod", "--connections", "500000", "--rate", "0.5", "--frame-bytes", "200"],
                env={}) == 0
    out = capsys.readouterr().out.splitlines()
    doc = (Path(__file__).resolve().parents[1] / "docs" / "scaling.md").read_text(encoding="utf-8").splitlines()
    start = doc.index(next(line for line in doc if line.startswith("  MODE ")))
    shown = doc[start:doc.index("  ...", start)] + [line for line in doc if line.startswith(("this environment deploys",
                                                                                          "recommended: "))]
    assert shown and all(line in out for line in shown), "docs/scaling.md: paste the plan's output again"
