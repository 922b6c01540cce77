"""``wsfleet logs ID``: a connection's lines, in time order, from a local run's files
(``--run-dir``, written here by the product's own logger) or from CloudWatch Logs
(FilterLogEvents on the log groups the service stack outputs, in the emulator); --since,
--follow, and one sentence when the logs cannot be read. A real fleet's run directory is
read in tests/test_fleet.py."""

from __future__ import annotations

import json
import time
import uuid
from types import SimpleNamespace

import boto3
import pytest

from tests.test_cli import run
from wsfleet import logs, stack_outputs
from wsfleet.cli import log_lines
from wsfleet.logs import JsonLogger

pytestmark = pytest.mark.timeout(60)


def write_run(directory, now: float) -> None:
    """w1 connects c1 and c2; w2 takes c1 over; the router logs c1's START; a line of
    another process that is not JSON, and one of c1 from an hour ago."""
    clock = SimpleNamespace(t=now - 3600)
    original = logs.time.time
    logs.time.time = lambda: clock.t
    try:
        with open(directory / "w1.log", "w") as w1, open(directory / "w2.log", "w") as w2, open(directory / "api.log", "w") as api:
            JsonLogger(w1, worker_id="w1").info("lease_acquired", connection_id="c1", fence_token=1)
            clock.t = now - 30
            JsonLogger(api, component="router").info("start", connection_id="c1", outcome="created")
            clock.t = now - 29
            JsonLogger(w1, worker_id="w1").bind(connection_id="c1", fence_token=2).info("connected", from_seq=1)
            JsonLogger(w1, worker_id="w1").bind(connection_id="c2", fence_token=1).info("connected", from_seq=1)
            clock.t = now - 10
            JsonLogger(w2, worker_id="w2").info("lease_acquired", connection_id="c1", fence_token=3, source="orphan")
            w2.write("not json, mentions c1\n")
    finally:
        logs.time.time = original


def test_a_run_dirs_lines_of_one_connection_in_time_order(capsys, tmp_path):
    now = time.time()
    write_run(tmp_path, now)

    code, out, err = run(capsys, {}, "logs", "c1", "--run-dir", str(tmp_path), "--json")
    assert (code, err) == (0, "")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(r.get("worker_id") or r.get("component"), r["event"]) for r in lines] == [
        ("router", "start"), ("w1", "connected"), ("w2", "lease_acquired"),
    ]  # the line of an hour ago is before --since's default 10 minutes
    assert all(r["connection_id"] == "c1" for r in lines)

    code, out, _ = run(capsys, {}, "logs", "c1", "--run-dir", str(tmp_path), "--since", "all")
    assert code == 0 and len(out.splitlines()) == 4
    assert out.splitlines()[-1].endswith("  info     w2  lease_acquired  fence_token=3 source=orphan")

    code, out, _ = run(capsys, {}, "logs", "c9", "--run-dir", str(tmp_path))
    assert (code, out) == (0, "no log lines for c9 in the last 10m00s\n")


def test_follow_shows_new_lines_as_they_are_written_and_ctrl_c_exits_0(capsys, tmp_path, monkeypatch):
    now = time.time()
    write_run(tmp_path, now)
    naps = []

    def nap(seconds):
        naps.append(seconds)
        if len(naps) == 1:
            with open(tmp_path / "w2.log", "a") as w2:
                w2.write('{"ts":%f,"level":"info","event":"socket_closed","worker_id":"w2","connection_id":"c1"}\n' % time.time())
                w2.write('{"ts":%f,"level":"info","event":"half a li' % time.time())  # still being written
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr(log_lines.time, "sleep", nap)
    code, out, err = run(capsys, {}, "logs", "c1", "--run-dir", str(tmp_path), "--follow", "--interval", "0.5", "--json")
    assert (code, err) == (0, "") and naps == [0.5, 0.5]
    assert [json.loads(line)["event"] for line in out.splitlines()] == ["start", "connected", "lease_acquired", "socket_closed"]


@pytest.fixture
def log_groups(emulator, aws_env):
    """A worker and a router log group with lines of c1 and c2, and a service stack
    naming them as the stack does."""
    suffix = uuid.uuid4().hex[:8]
    client = boto3.client("logs", endpoint_url=emulator.endpoint_url, region_name=aws_env["AWS_REGION"])
    now_ms = int(time.time() * 1000)
    groups = {"worker": f"/wsfleet/workers-{suffix}", "router": f"/wsfleet/router-{suffix}"}
    lines = {
        "worker": [(now_ms - 20_000, {"event": "connected", "worker_id": "w1", "connection_id": "c1"}),
                   (now_ms - 15_000, {"event": "connected", "worker_id": "w1", "connection_id": "c2"}),
                   (now_ms - 5_000, {"event": "socket_closed", "worker_id": "w1", "connection_id": "c1"})],
        "router": [(now_ms - 25_000, {"event": "start", "component": "router", "connection_id": "c1"})],
    }
    for which, group in groups.items():
        client.create_log_group(logGroupName=group)
        client.create_log_stream(logGroupName=group, logStreamName="s")
        client.put_log_events(logGroupName=group, logStreamName="s", logEvents=[
            {"timestamp": ts, "message": json.dumps({"ts": ts / 1000, "level": "info", **fields})} for ts, fields in lines[which]
        ])
    cfn = boto3.client("cloudformation", endpoint_url=emulator.endpoint_url, region_name=aws_env["AWS_REGION"])
    outputs = {stack_outputs.WORKER_LOG_GROUP_NAME: groups["worker"], stack_outputs.ROUTER_LOG_GROUP_NAME: groups["router"]}
    stack = f"wsfleet-l{suffix}-service"
    cfn.create_stack(StackName=stack, TemplateBody=json.dumps({
        "Resources": {"Queue": {"Type": "AWS::SQS::Queue"}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }))
    return SimpleNamespace(groups=groups, stack=stack, env_name=f"l{suffix}")


def test_cloudwatch_lines_of_one_connection_from_the_stacks_log_groups(capsys, aws_env, log_groups):
    code, out, err = run(capsys, aws_env, "logs", "c1", "--env", log_groups.env_name, "--json")
    assert (code, err) == (0, "")
    assert [json.loads(line)["event"] for line in out.splitlines()] == ["start", "connected", "socket_closed"]
    code, out, _ = run(capsys, aws_env, "logs", "c2", "--log-group", log_groups.groups["worker"], "--output", "json")
    assert code == 0 and [json.loads(line)["connection_id"] for line in out.splitlines()] == ["c2"]
    # FilterLogEvents is asked for the connection's lines only (the emulator ignores JSON patterns; CloudWatch does not).
    assert log_lines.pattern("c1") == '{ $.connection_id = "c1" }'


def test_logs_that_cannot_be_read_are_one_sentence(capsys, aws_env, log_groups):
    code, out, err = run(capsys, aws_env, "logs", "c1", "--log-group", "/nope")
    assert (code, out, err) == (1, "", "wsfleet: log group /nope does not exist in us-east-1.\n")
    code, _, err = run(capsys, aws_env, "logs", "c1", "--stack", f"wsfleet-{log_groups.env_name}-nope")
    assert code == 1 and "does not exist" in err and err.count("\n") == 1
    code, _, err = run(capsys, {k: v for k, v in aws_env.items() if k != "WSFLEET_ENV"}, "logs", "c1")
    assert code == 1 and "which fleet?" in err and "--run-dir DIR" in err
    code, _, err = run(capsys, {}, "logs", "c1", "--run-dir", "/nonexistent/run")
    assert (code, err) == (1, "wsfleet: --run-dir /nonexistent/run: no such directory.\n")


def test_a_logs_endpoint_out_of_reach_is_one_sentence_within_seconds(capsys, aws_env):
    began = time.monotonic()
    code, _, err = run(capsys, {**aws_env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, "logs", "c1", "--log-group", "/g")
    assert code == 1 and "Could not connect to the endpoint URL" in err and err.count("\n") == 1
    assert time.monotonic() - began < 10
