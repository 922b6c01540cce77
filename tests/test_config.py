"""Configuration: defaults, and a bad value is an error that names its variable."""

import pytest

from wsfleet.config import RouterConfig, WorkerConfig
from wsfleet.settings_spec import ConfigError

BASE = {
    "TABLE_NAME": "t",
    "SESSIONS_TABLE_NAME": "s",
    "MESSAGES_TABLE_NAME": "m",
    "MESSAGES_BUCKET_NAME": "b",
    "QUEUE_URL": "http://q",
    "AWS_REGION": "eu-west-1",
}


def test_worker_defaults_follow_the_contract():
    c = WorkerConfig.from_env(BASE)
    assert (c.lease_ms, c.heartbeat_ms, c.reconcile_ms, c.checkpoint_ms, c.max_connections, c.max_clock_skew_ms) == (
        10_000,
        2_500,
        10_000,
        120_000,
        100,
        1_000,
    )
    assert c.metrics_namespace == "WsFleet" and c.state_shards == 4 and c.worker_id is None
    assert c.endpoint_url is None and c.region == "eu-west-1"
    assert c.max_frame_bytes == 32 * 1024 * 1024 and c.messages_bucket_name == "b"


def test_the_buffered_bytes_budget_defaults_to_half_the_task_memory_and_can_be_set_or_switched_off(tmp_path):
    from wsfleet import budget

    frame = 32 << 20
    assert WorkerConfig.from_env(BASE).max_buffered_bytes == budget.default_budget_bytes(budget.task_memory_bytes(), frame)
    assert WorkerConfig.from_env({**BASE, "MAX_BUFFERED_BYTES": "67108864"}).max_buffered_bytes == 64 << 20
    assert WorkerConfig.from_env({**BASE, "MAX_BUFFERED_BYTES": "off"}).max_buffered_bytes is None
    limit = tmp_path / "memory.max"
    limit.write_text("536870912\n")
    # 512 MiB less the decoder's reserve (32 MiB and six frames at the limit: 224 MiB), halved.
    assert budget.decoder_reserve_bytes(frame) == 224 << 20
    assert budget.default_budget_bytes(budget.task_memory_bytes(limit), frame) == 144 << 20
    assert budget.default_budget_bytes(256 << 20, frame) == frame  # never under one frame
    limit.write_text("max\n")
    assert budget.task_memory_bytes(limit) is None and budget.default_budget_bytes(None, frame) == budget.FALLBACK_BYTES
    assert budget.task_memory_bytes(tmp_path / "absent") is None


def test_the_budget_gives_the_sockets_slots_for_whole_frames_and_the_writer_the_rest():
    from wsfleet.budget import MemoryBudget

    b = MemoryBudget(total_bytes=256 << 20, max_frame_bytes=32 << 20)
    assert (b.receive_slots, b.writer_bytes) == (2, 128 << 20)
    assert MemoryBudget(total_bytes=8 << 20, max_frame_bytes=32 << 20).receive_slots == 1  # a frame at the limit still gets in


def test_fractional_seconds_are_accepted_for_fast_local_runs():
    c = WorkerConfig.from_env({**BASE, "LEASE_SECONDS": "2.5", "HEARTBEAT_SECONDS": "0.5", "MAX_CLOCK_SKEW_MS": "200"})
    assert (c.lease_ms, c.heartbeat_ms) == (2_500, 500)


@pytest.mark.parametrize(
    "override, variable",
    [
        ({"TABLE_NAME": ""}, "TABLE_NAME"),
        ({"SESSIONS_TABLE_NAME": ""}, "SESSIONS_TABLE_NAME"),
        ({"CHECKPOINT_SECONDS": "0"}, "CHECKPOINT_SECONDS"),
        ({"MESSAGES_TABLE_NAME": " "}, "MESSAGES_TABLE_NAME"),
        ({"MESSAGES_BUCKET_NAME": ""}, "MESSAGES_BUCKET_NAME"),
        ({"MAX_FRAME_BYTES": "1000"}, "MAX_FRAME_BYTES"),
        ({"MAX_FRAME_BYTES": "32MiB"}, "MAX_FRAME_BYTES"),
        ({"MAX_BUFFERED_BYTES": "1000"}, "MAX_BUFFERED_BYTES"),
        ({"MAX_BUFFERED_BYTES": "256MiB"}, "MAX_BUFFERED_BYTES"),
        ({"QUEUE_URL": ""}, "QUEUE_URL"),
        ({"AWS_REGION": ""}, "AWS_REGION"),
        ({"AWS_ENDPOINT_URL": "localhost:5000"}, "AWS_ENDPOINT_URL"),
        ({"LEASE_SECONDS": "abc"}, "LEASE_SECONDS"),
        ({"LEASE_SECONDS": "-5"}, "LEASE_SECONDS"),
        ({"LEASE_SECONDS": "nan"}, "LEASE_SECONDS"),
        ({"LEASE_SECONDS": "8", "HEARTBEAT_SECONDS": "5"}, "LEASE_SECONDS"),
        ({"HEARTBEAT_SECONDS": "0"}, "HEARTBEAT_SECONDS"),
        ({"RECONCILE_SECONDS": "x"}, "RECONCILE_SECONDS"),
        ({"MAX_CONNECTIONS": "0"}, "MAX_CONNECTIONS"),
        ({"MAX_CONNECTIONS": "1.5"}, "MAX_CONNECTIONS"),
        ({"MAX_CLOCK_SKEW_MS": "-1"}, "MAX_CLOCK_SKEW_MS"),
        ({"MAX_CLOCK_SKEW_MS": "15000"}, "MAX_CLOCK_SKEW_MS"),
        ({"STATE_SHARDS": "0"}, "STATE_SHARDS"),
        ({"SHUTDOWN_SECONDS": "soon"}, "SHUTDOWN_SECONDS"),
        ({"MESSAGE_TTL_DAYS": "-2"}, "MESSAGE_TTL_DAYS"),
        ({"FLUSH_INTERVAL_MS": "fast"}, "FLUSH_INTERVAL_MS"),
    ],
)
def test_a_bad_worker_setting_is_an_error_naming_the_variable(override, variable):
    with pytest.raises(ConfigError, match=variable):
        WorkerConfig.from_env({**BASE, **override})


def test_region_falls_back_to_the_sdk_default_variable():
    env = {**BASE, "AWS_REGION": "", "AWS_DEFAULT_REGION": "us-west-2"}
    assert WorkerConfig.from_env(env).region == "us-west-2"


def test_the_router_needs_the_sessions_table_to_tell_owners_of_a_stop():
    with pytest.raises(ConfigError, match="SESSIONS_TABLE_NAME"):
        RouterConfig.from_env({**BASE, "SESSIONS_TABLE_NAME": ""})


def test_router_parses_allowed_hosts_and_refuses_bad_patterns():
    c = RouterConfig.from_env({**BASE, "ALLOWED_WS_HOSTS": " Feed.Example.com, *.stream.io ,127.0.0.1"})
    assert c.allowed_ws_hosts == ("feed.example.com", "*.stream.io", "127.0.0.1")
    assert RouterConfig.from_env(BASE).allowed_ws_hosts == ()
    for bad in ("*", "a.*.com", "*example.com"):
        with pytest.raises(ConfigError, match="ALLOWED_WS_HOSTS"):
            RouterConfig.from_env({**BASE, "ALLOWED_WS_HOSTS": bad})


@pytest.mark.parametrize("cls", [WorkerConfig, RouterConfig])
def test_the_sink_is_the_table_by_default_a_stream_or_both(cls):
    assert cls.from_env(BASE).sinks == ("dynamodb",)
    kinesis = cls.from_env({**BASE, "SINK": "kinesis", "MESSAGES_STREAM_NAME": "wsfleet-dev-messages"})
    assert kinesis.sinks == ("kinesis",) and kinesis.messages_stream_name == "wsfleet-dev-messages"
    both = cls.from_env({**BASE, "SINK": " Kinesis , dynamodb ", "MESSAGES_STREAM_NAME": "s"})
    assert both.sinks == ("dynamodb", "kinesis")
    # A stream-only environment needs no messages table.
    table_less = {k: v for k, v in BASE.items() if k != "MESSAGES_TABLE_NAME"}
    assert cls.from_env({**table_less, "SINK": "kinesis", "MESSAGES_STREAM_NAME": "s"}).messages_table_name == ""
    arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/wsfleet-prod-messages"
    assert cls.from_env({**BASE, "SINK": "kinesis", "MESSAGES_STREAM_NAME": arn}).messages_stream_name == arn


def test_the_worker_takes_firehose_alone_or_with_the_others_and_needs_its_delivery_stream():
    alone = WorkerConfig.from_env({**BASE, "SINK": "firehose", "MESSAGES_DELIVERY_STREAM_NAME": "wsfleet-dev-frames"})
    assert alone.sinks == ("firehose",) and alone.messages_delivery_stream_name == "wsfleet-dev-frames"
    every = WorkerConfig.from_env(
        {**BASE, "SINK": "firehose,kinesis,dynamodb", "MESSAGES_STREAM_NAME": "s", "MESSAGES_DELIVERY_STREAM_NAME": "f"}
    )
    assert every.sinks == ("dynamodb", "kinesis", "firehose")
    for env, named in (
        ({"SINK": "firehose"}, "MESSAGES_DELIVERY_STREAM_NAME is required when SINK is firehose"),
        ({"SINK": "firehose", "MESSAGES_DELIVERY_STREAM_NAME": "arn:aws:firehose:x"}, "must be a Firehose stream name"),
        ({"SINK": "fire-hose"}, "SINK must be one or more of dynamodb, kinesis, firehose, comma-separated, got 'fire-hose'"),
    ):
        with pytest.raises(ConfigError, match=named):
            WorkerConfig.from_env({**BASE, **env})


@pytest.mark.parametrize(
    "env, named",
    [
        ({"SINK": "s3"}, "SINK"),
        ({"SINK": "dynamodb,"}, "SINK"),
        ({"SINK": "kinesis"}, "MESSAGES_STREAM_NAME"),
        ({"SINK": "kinesis", "MESSAGES_STREAM_NAME": "bad name!"}, "MESSAGES_STREAM_NAME"),
        ({"SINK": "dynamodb", "MESSAGES_TABLE_NAME": ""}, "MESSAGES_TABLE_NAME"),
    ],
)
def test_a_bad_sink_setting_names_its_variable(env, named):
    for cls in (WorkerConfig, RouterConfig):
        with pytest.raises(ConfigError, match=named):
            cls.from_env({**BASE, **env})
