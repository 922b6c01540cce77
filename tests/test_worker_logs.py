"""A real worker's whole output, with X-Ray enabled and no X-Ray daemon: every line is
one JSON object, and the SDK's failing sampling poller is reported once."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys

import pytest

from sim.processes import eventually
from sim.upstream import ThreadedUpstream
from wsfleet.router import Router

pytestmark = pytest.mark.slow

# The X-Ray SDK polls for sampling rules when the first segment opens, then every
# 5 minutes, and has no setting for that. This runs the worker with the SDK's interval
# cut to 1 s, appending a line to the file named in argv[1] after each poll so that the
# test sees the polls happen. (AWS_MAX_ATTEMPTS=1 in the environment makes a poll fail
# at once rather than after botocore's retries; the worker's own clients set theirs.)
WORKER_POLLING_EVERY_SECOND = """
import runpy, sys
from aws_xray_sdk.core.sampling.rule_poller import RulePoller

polls = open(sys.argv[1], "a", buffering=1)
refresh = RulePoller._refresh_cache

def refresh_and_count(self):
    refresh(self)
    polls.write("poll\\n")

RulePoller._refresh_cache = refresh_and_count
RulePoller._reset_time_to_wait = lambda self: setattr(self, "_time_to_wait", 1)
runpy.run_module("wsfleet.worker", run_name="__main__", alter_sys=True)
"""
POLLS = 3


def closed_port() -> int:
    """A loopback port nothing listens on (it was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_every_line(output: str) -> list[dict]:
    events = []
    for line in output.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            pytest.fail(f"a line that is not JSON: {line!r}")
        assert isinstance(event, dict), line
        events.append(event)
    return events


def test_a_worker_without_an_xray_daemon_prints_only_json_lines_and_reports_it_once(
    python_env, aws_env, ddb, sqs, tmp_path
):
    polls = tmp_path / "polls"
    env = {
        **python_env,
        **aws_env,
        "WORKER_ID": "logs-1",
        "RECONCILE_SECONDS": "0.5",
        "AWS_XRAY_DAEMON_ADDRESS": f"127.0.0.1:{closed_port()}",
        "AWS_MAX_ATTEMPTS": "1",
    }
    del env["AWS_XRAY_SDK_ENABLED"]  # X-Ray on, as on ECS, but no daemon
    router = Router.from_env({**aws_env, "ALLOWED_WS_HOSTS": "127.0.0.1"}, ddb=ddb, sqs=sqs)
    with ThreadedUpstream(rate=5.0) as up:
        body = {"event_type": "START", "connection_id": "c1", "ws_url": up.url_for("c1")}
        started = router.handle({"httpMethod": "POST", "resource": "/events", "path": "/events", "body": json.dumps(body)})
        assert started["statusCode"] == 202
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER_POLLING_EVERY_SECOND, str(polls)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            # The connection's segments start the poller; wait until it has failed repeatedly.
            eventually(lambda: up.open_sockets("c1"), 15, "the worker to connect c1")
            eventually(
                lambda: polls.exists() and len(polls.read_text().splitlines()) >= POLLS, 15, f"{POLLS} sampling polls"
            )
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()

    assert proc.returncode == 0, err
    events = parse_every_line(out) + parse_every_line(err)
    names = [e["event"] for e in events]
    assert names.count("xray_sampling_unavailable") == 1
    assert {"worker_started", "lease_acquired", "connected", "lease_released"} <= set(names)
    (unavailable,) = [e for e in events if e["event"] == "xray_sampling_unavailable"]
    assert unavailable["worker_id"] == "logs-1" and unavailable["logger"].startswith("aws_xray_sdk")
    assert "Could not connect" in unavailable["detail"]
