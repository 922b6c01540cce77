"""`wsfleet plan`'s sinks side by side (issue 21): the messages table, the Kinesis stream
with its reference consumer, or both, checked against hand-computed cases (the figures
in the comments are worked by hand from the price tables in wsfleet.plan.sinks)."""

from __future__ import annotations

import json
import math

import pytest

from wsfleet import aggregation, records
from wsfleet.plan import model
from wsfleet.plan import sinks as plan_sinks
from wsfleet.cli import main
from wsfleet.stream import Frame

PRICES = {"dynamodb_wru_per_million": 0.625, "dynamodb_rru_per_million": 0.125, "sqs_requests_per_million": 0.4,
          "cloudwatch_logs_ingest_per_gb": 0.0, "cloudwatch_custom_metric_month": 0.0}  # metrics: tests/test_metrics.py
MONTH_S = 730 * 3600  # 2,628,000 s


def _measured() -> model.Measured:
    """One renewal per worker every 2.5 s and nothing else: holding is that alone."""
    return model.Measured(ops=(model.Op("renewal", "sessions", "", "own", 1440, wru=1),), fixed_per_worker_hour={},
                         message_wru=1, checkpoint_wru=1, prices=PRICES, measured_with={})


def test_a_record_is_the_encoded_frame_and_its_partition_key_and_is_billed_per_started_kb():
    frame = Frame(seq=10**9, data_json='"' + "x" * 254 + '"', received_at_ms=1_800_000_000_000)
    encoded = records.encode("c" * 36, 10**6, "w" * 32, frame)
    assert records.decode(encoded).data == "x" * 254
    assert plan_sinks.record_bytes(256) == len(encoded) + 36
    assert plan_sinks.record_bytes(1256) - plan_sinks.record_bytes(256) == 1000  # the envelope is fixed
    assert [plan_sinks.billed_kb(n) for n in (1, 1024, 1025, 4608)] == [1, 1, 2, 5]  # 4.5 KB counts as 5


def test_the_stream_and_its_consumer_cost_what_the_hand_computation_says():
    # 1,000 records/s of 1,500 bytes (billed 2 KB each), kept 72 h, 10 workers, 1,000
    # connections; the consumer in batches of up to 100 or 1 s.
    consumer = plan_sinks.Consumer(batch_size=100, window_s=1.0, ms_per_invocation=200, memory_mb=256)
    k = plan_sinks.kinesis_month(records_per_s=1000, record_size=1500, connections=1000, workers=10,
                                 retention_hours=72, consumer=consumer, prices=PRICES)
    m = k["month"]
    # 2,048,000 billed bytes/s over 2,628,000 s = 5.382e12 bytes = 5,012.5 GB (2^30).
    assert k["gb_ingested_per_month"] == pytest.approx(5012.5, rel=1e-4)
    assert m["ingest"] == pytest.approx(401.0, rel=1e-3)  # x $0.08
    assert m["retrieval"] == pytest.approx(200.5, rel=1e-3)  # x $0.04, read once by the consumer
    assert m["stream"] == pytest.approx(29.2)  # 730 h x $0.04
    # 48 h past the free 24: 2,048,000 x 3,600 / 2^30 = 6.866 GB per hour kept, x 48 = 329.6 GB x $0.10.
    assert m["retention"] == pytest.approx(32.96, rel=1e-3)
    # 1.5 MB/s needs 1.43 shards; room for twice that is 3, under the default 4.
    assert k["shards"] == 4
    # KMS: 10 workers + 4 consumer environments, a call each every 300 s: 122,640 calls; + $1 the key.
    assert k["kms_requests_per_month"] == pytest.approx(122_640)
    assert m["kms"] == pytest.approx(1 + 12.264 * 0.03)
    c = k["consumer"]
    # 250 records/s per shard: a batch of 100 every 0.4 s, 2.5 invocations/s on each of 4.
    assert c["invocations"] == pytest.approx(10.0) and c["records_per_invocation"] == pytest.approx(100.0)
    # 100 records of 250 connections (per shard) hold 250 x (1 - 0.996^100) = 82.5 of them.
    assert c["state_writes"] == pytest.approx(10 * 82.52, rel=1e-3)
    assert c["s3_puts"] == pytest.approx(10.0)  # one object per batch
    assert m["consumer_lambda"] == pytest.approx(10 * MONTH_S * (0.2e-6 + 0.2 * 0.25 * 0.0000166667), rel=1e-6)  # $27.16
    assert m["consumer_s3"] == pytest.approx(131.4)  # 26.28 M PUTs x $0.005 / 1,000
    assert m["consumer_state"] == pytest.approx(825.2 * 2.628 * 0.625, rel=1e-3)  # write units x $0.625 / million
    assert m["total"] == pytest.approx(sum(v for key, v in m.items() if key != "total"))


def test_without_a_consumer_the_stream_is_ingest_hours_and_kms_only():
    k = plan_sinks.kinesis_month(records_per_s=500, record_size=473, connections=1000, workers=15, retention_hours=24,
                                 consumer=None, prices=PRICES)
    # 500 x 1 KB per second over the month: 1,253.1 GB x $0.08.
    assert k["month"]["ingest"] == pytest.approx(100.25, rel=1e-3)
    assert k["month"]["retrieval"] == 0 and k["consumer"] is None and k["month"]["retention"] == 0
    assert k["kms_requests_per_month"] == pytest.approx(15 * MONTH_S / 300)


def test_the_table_costs_a_write_unit_per_started_kb_and_its_storage_for_the_ttl():
    t = plan_sinks.dynamodb_month(records_per_s=500, item_size=1100, ttl_days=3, prices=PRICES)
    assert t["wru_per_message"] == 2
    # 1,000 WRU/s x 2,628,000 s = 2,628 M x $0.625.
    assert t["month"]["writes"] == pytest.approx(1642.5)
    # 500 x 259,200 s x 1,200 bytes (100 of overhead) = 155.5e9 bytes = 144.8 GB x $0.25.
    assert t["stored_gb"] == pytest.approx(144.84, rel=1e-3)
    assert t["month"]["storage"] == pytest.approx(36.21, rel=1e-3)


def test_the_sinks_side_by_side_share_holding_and_checkpoints_and_both_pays_for_each():
    p = plan_sinks.sinks(_measured(), connections=1000, per_worker=100, rate=0.5, shards=4, checkpoint_s=120, ttl_days=3)
    table, stream, both = (p["sinks"][k]["month"] for k in ("dynamodb", "kinesis", "dynamodb,kinesis"))
    # Holding: 10 workers x 1,440 renewals an hour x 730 h = 10.512 M write units x $0.625.
    assert table["holding"] == stream["holding"] == pytest.approx(6.57)
    # A checkpoint per connection every 120 s, each a transactional write of a 1-unit
    # item (2 units): 16.67 write units/s, 43.8 M a month x $0.625.
    assert table["checkpoints"] == stream["checkpoints"] == pytest.approx(27.375)
    assert table["dynamodb"] == pytest.approx(p["dynamodb"]["month"]["total"])
    assert stream["kinesis"] == pytest.approx(p["kinesis"]["month"]["total"])
    assert both["total"] == pytest.approx(table["total"] + stream["kinesis"])
    assert p["sinks"]["kinesis"]["per_1000_connections"] == pytest.approx(stream["total"])  # 1,000 connections
    # A small frame: under 1 KB as an item and as a record, so a write unit against a KB ingested.
    assert p["dynamodb"]["wru_per_message"] == 1 and plan_sinks.billed_kb(p["record_bytes"]) == 1
    assert stream["total"] < table["total"]


def test_the_consumer_at_the_mappings_defaults_costs_a_state_write_per_frame_at_low_rates():
    low = plan_sinks.consumer_rates(records_per_s=500, connections=1000, shards=4,
                                    consumer=plan_sinks.Consumer(batch_size=100, window_s=1))
    batched = plan_sinks.consumer_rates(records_per_s=500, connections=1000, shards=4,
                                        consumer=plan_sinks.Consumer(batch_size=1000, window_s=30))
    # 125 records/s per shard in batches of 100: 100 of 250 connections, 82 distinct.
    assert low["state_writes"] / 500 == pytest.approx(0.825, rel=1e-2)
    # Batches of 1,000 (8 s): 250 x (1 - 0.996^1000) = 245.5 distinct, a write per 4 frames.
    assert batched["state_writes"] / 500 == pytest.approx(245.5 / 1000, rel=1e-2)
    # The defaults (10,000 or 30 s): 3,750 records a batch, all 250 connections in it.
    default = plan_sinks.consumer_rates(records_per_s=500, connections=1000, shards=4, consumer=plan_sinks.Consumer())
    assert default["records_per_invocation"] == pytest.approx(3750)
    assert default["state_writes"] / 500 == pytest.approx(250 / 3750, rel=1e-3)
    assert plan_sinks.consumer_rates(records_per_s=0, connections=10, shards=4, consumer=plan_sinks.Consumer())["invocations"] == 0
    # A quiet shard (0.1 records/s): with a 1 s window an invocation per record, never
    # more invocations than records; with the 30 s window, one per 30 s of 3 records.
    quiet = plan_sinks.consumer_rates(records_per_s=0.4, connections=10, shards=4,
                                      consumer=plan_sinks.Consumer(batch_size=100, window_s=1))
    assert quiet["invocations"] == pytest.approx(0.4) and quiet["records_per_invocation"] == pytest.approx(1.0)
    slow = plan_sinks.consumer_rates(records_per_s=0.4, connections=10, shards=4, consumer=plan_sinks.Consumer())
    assert slow["invocations"] == pytest.approx(4 / 30) and slow["records_per_invocation"] == pytest.approx(3.0)


def test_a_batch_is_cut_at_the_invocation_payload_limit():
    # A 473-byte record is 632 bytes of base64 and about 650 of event: 4,907 in 6 MiB.
    assert plan_sinks.batch_cap(473) == 6 * 1024 * 1024 // 1282 == 4907
    # 1,000 records/s on one shard: 10,000 would fill in 10 s, but a batch stops at 4,907.
    r = plan_sinks.consumer_rates(records_per_s=1000, connections=100, shards=1, consumer=plan_sinks.Consumer(),
                                  record_size=473)
    assert r["records_per_invocation"] == pytest.approx(4907)


def test_the_limits_say_where_each_binds():
    listed = plan_sinks.limits(connections=100_000, per_worker=100, rate=5, record_size=2000, item_size=1500, flush_ms=100)
    lim = {x["name"].split(":")[0] + ":" + x["sink"]: x for x in listed}
    one = lim["one connection:kinesis"]
    # A 2,000-byte record: 1 MiB/s per shard allows 524.3 records/s, under the 1,000 records/s.
    assert one["reached_at"] == pytest.approx(524.288)
    default = next(x for x in listed if "default write capacity" in x["name"])
    # 500,000 records/s x 2,000 bytes = 1e9 bytes/s against 4 MiB/s: full at 419 connections.
    assert default["utilisation"] == pytest.approx(1e9 / (4 << 20))
    assert default["reached_at"] == pytest.approx(100_000 * (4 << 20) / 1e9)
    # The table: 2 write units a frame, 1,000,000 WRU/s against the 40,000 quota: 4,000 connections.
    assert lim["messages table:dynamodb"]["reached_at"] == pytest.approx(4000)
    assert lim["one connection:dynamodb"]["reached_at"] == pytest.approx(500)  # 1,000 WRU/s / 2
    # PutRecords: 100 x 5 x 0.1 s = 50 records a flush; a call holds 500 (5 MiB / 2,000 B is more).
    assert lim["PutRecords:kinesis"]["utilisation"] == pytest.approx(0.1)


def test_plan_prints_the_sinks_side_by_side_and_its_json_is_the_computation(capsys):
    argv = ["plan", "--connections", "1000", "--rate", "5", "--env", "prod", "--frame-bytes", "600",
            "--stream-retention-hours", "48", "--consumer-batch", "500", "--consumer-window", "10", "--json"]
    assert main(argv, env={}) == 0
    out = json.loads(capsys.readouterr().out)["sinks"]
    expected = plan_sinks.sinks(model.load_measured(), connections=1000, per_worker=1690, rate=5, shards=16,
                                checkpoint_s=120, ttl_days=30, frame_bytes=600, retention_hours=48,
                                consumer=plan_sinks.Consumer(batch_size=500, window_s=10))
    assert out == json.loads(json.dumps(expected))
    assert main(["plan", "--connections", "1000", "--rate", "0.5"], env={}) == 0
    text = capsys.readouterr().out
    assert "where frames go (SINK)" in text and "dynamodb,kinesis" in text and "where the sinks' limits bind" in text
    assert main(["plan", "--connections", "1000", "--rate", "0.5", "--no-consumer"], env={}) == 0
    assert "no consumer priced" in capsys.readouterr().out


def test_plan_refuses_a_stream_retention_kinesis_does_not_offer(capsys):
    assert main(["plan", "--connections", "10", "--stream-retention-hours", "12"], env={}) == 2
    assert "must be from 24 to 8760 hours" in capsys.readouterr().err


def test_packing_prices_a_flushs_frames_as_one_aggregate_of_the_size_the_sink_writes():
    frame = Frame(seq=10**9, data_json='"' + "x" * 198 + '"', received_at_ms=1_800_000_000_000)
    user = records.encode("c" * 36, 10**6, "w" * 32, frame)
    assert len(user) + 36 == plan_sinks.record_bytes(200)
    # What n frames of one flush are on the stream, built as the sink builds them.
    size = {n: (len(aggregation.pack("c" * 36, [user] * n)) if n > 1 else len(user)) + 36 for n in range(1, 60)}
    assert (size[1], size[2], size[3]) == (417, 872, 1261)  # billed 1, 1 and 2 KB
    p = plan_sinks.packing(rate=0.5, flush_ms=5000, per_worker=10, user_record_bytes=len(user))
    # 2.5 frames a flush on average: a record whenever there is at least one.
    mean = 2.5
    poisson = {n: math.exp(-mean) * mean**n / math.factorial(n) for n in size}
    assert (p.period_s, p.frames_per_flush) == (5.0, mean)
    assert p.records_per_message == pytest.approx((1 - math.exp(-mean)) / mean)  # 0.367
    assert p.billed_kb_per_message == pytest.approx(sum(poisson[n] * plan_sinks.billed_kb(size[n]) for n in size) / mean)
    assert p.bytes_per_message == pytest.approx(sum(poisson[n] * size[n] for n in size) / mean)
    # The writer's call of 500 frames ends a flush sooner: 250 connections x 0.5/s fill it in 4 s.
    assert plan_sinks.packing(rate=0.5, flush_ms=10_000, per_worker=250, user_record_bytes=len(user)).period_s == 4.0
    # A frame now and then is a plain record, as unpacked; aggregates stay under their bound.
    rare = plan_sinks.packing(rate=1e-6, flush_ms=100, per_worker=10, user_record_bytes=len(user))
    assert rare.records_per_message == pytest.approx(1) and rare.billed_kb_per_message == pytest.approx(1)
    busy = plan_sinks.packing(rate=1000, flush_ms=10_000, per_worker=1, user_record_bytes=len(user), batch=10**6)
    # 10,000 +- 100 frames a flush, 2,526 in an aggregate of at most 1 MiB less 64 KiB: 4
    # records, 5 in the 15 % of flushes with over 10,104.
    assert (records.MAX_AGGREGATE_BYTES - size[2] + 2 * 389) // 389 == 2526 and size[3] - size[2] == 389
    assert busy.record_bytes <= records.MAX_AGGREGATE_BYTES
    assert busy.records_per_message == pytest.approx(4.15 / 10_000, rel=0.01)


def test_plan_takes_the_flush_interval_and_refuses_one_the_worker_would_not(capsys):
    assert main(["plan", "--connections", "1000", "--rate", "0.5", "--flush-ms", "5000", "--json"], env={}) == 0
    out = json.loads(capsys.readouterr().out)["sinks"]
    assert out["flush_ms"] == 5000 and out["packing"]["kinesis"]["records_per_message"] == pytest.approx(0.367, abs=1e-3)
    assert main(["plan", "--connections", "10", "--flush-ms", "20000"], env={}) == 2
    assert "must be a whole number from 0 to 10000 (FLUSH_INTERVAL_MS's bounds)" in capsys.readouterr().err


def test_plan_prices_the_delivered_objects_at_the_gzip_ratio_it_is_given(capsys):
    args = ["plan", "--connections", "1000", "--rate", "0.5", "--json"]
    assert main(args, env={}) == 0
    floor = json.loads(capsys.readouterr().out)["sinks"]["firehose"]
    assert main([*args, "--gzip-ratio", "8"], env={}) == 0
    json_feed = json.loads(capsys.readouterr().out)["sinks"]["firehose"]
    assert floor["gzip_ratio"] == 2 and json_feed["gzip_ratio"] == 8
    assert json_feed["month"]["storage"] == pytest.approx(floor["month"]["storage"] / 4)
    assert main(["plan", "--connections", "10", "--gzip-ratio", "0.9"], env={}) == 2
    assert "--gzip-ratio: must be 1 or more" in capsys.readouterr().err


def test_firehose_bills_each_record_rounded_up_to_5_kb_and_a_longer_flush_shares_the_rounding():
    from wsfleet.plan.firehose import GB, GZIP_RATIO, firehose_month, ingest_dollars, line_bytes
    from wsfleet.plan.model import HOURS_PER_MONTH, S3_PRICES
    from wsfleet.plan.prices import FIREHOSE_PRICES
    from wsfleet.records import FIREHOSE_BUFFER_SECONDS as BUFFER_SECONDS

    month_s = HOURS_PER_MONTH * 3600
    alone = firehose_month(connections=1000, per_worker=1, rate=0.5, period_s=1e-6, record_bytes=437, ttl_days=30)
    assert alone["line_bytes"] == line_bytes(437) == 437 + len(',"connection_bucket":63') + 1
    assert alone["records_per_message"] == pytest.approx(1) and alone["billed_kb_per_message"] == pytest.approx(5)
    m = alone["month"]
    assert m["ingest"] == pytest.approx(ingest_dollars(500 * 5 * 1024 * month_s / GB)) == pytest.approx(
        500 * 5 * 1024 * month_s / GB * 0.029)  # the first tier's price a GB
    # The objects are kept GZIP'd: the lines' bytes over the ratio (2 unless told).
    assert GZIP_RATIO == 2 and alone["gzip_ratio"] == GZIP_RATIO
    assert m["storage"] == pytest.approx(500 * alone["line_bytes"] / GZIP_RATIO * 30 * 86400 / GB * S3_PRICES["gb_month"])
    json_feed = firehose_month(connections=1000, per_worker=1, rate=0.5, period_s=1e-6, record_bytes=437, ttl_days=30,
                               gzip_ratio=8)
    assert json_feed["month"]["storage"] == pytest.approx(m["storage"] / 4)
    assert json_feed["stored_gb"] == pytest.approx(alone["stored_gb"] / 4)
    assert {k: v for k, v in json_feed["month"].items() if k not in ("storage", "total")} == {
        k: v for k, v in m.items() if k not in ("storage", "total")}
    with pytest.raises(ValueError, match="a ratio of at least 1"):
        firehose_month(connections=1000, per_worker=1, rate=0.5, period_s=1.0, record_bytes=437, ttl_days=30, gzip_ratio=0.5)
    # 1,000 connections at 256 B frames: far below a 128 MiB buffer, so one object per
    # connection bucket (64) every buffer interval.
    objects = 64 * month_s / BUFFER_SECONDS
    assert alone["objects_per_month"] == pytest.approx(objects)
    assert m["s3_puts"] == pytest.approx(objects / 1000 * S3_PRICES["put_per_thousand"])
    assert m["partitioning"] == pytest.approx(500 * alone["line_bytes"] * month_s / GB * FIREHOSE_PRICES["dynamic_partitioning_gb"]
                                              + objects / 1000 * FIREHOSE_PRICES["per_1000_objects"])
    assert alone["per_message"] == pytest.approx(m["total"] / (500 * month_s))
    packed = firehose_month(connections=1000, per_worker=1, rate=0.5, period_s=5.0, record_bytes=437, ttl_days=30)
    assert packed["records_per_message"] < 0.5 and packed["billed_kb_per_message"] < 2.5
    assert packed["month"]["total"] < m["total"]
    # A worker's flush holds every connection's frames: prod's 1,690 connections x 0.5/s x
    # 0.1 s are 84.5 lines a record, and the rounding to 5 KB all but vanishes.
    worker = firehose_month(connections=500_000, per_worker=1690, rate=0.5, period_s=0.1, record_bytes=437, ttl_days=30)
    assert worker["records_per_message"] == pytest.approx(1 / 84.5, rel=0.05)
    assert worker["billed_kb_per_message"] < 1.15 * worker["line_bytes"] / 1024
    # and at most 500 frames a record (the writer's call), whatever the flush
    full = firehose_month(connections=10_000, per_worker=5000, rate=10, period_s=1.0, record_bytes=100, ttl_days=30)
    assert full["records_per_message"] == pytest.approx(1 / 500, rel=0.01)
