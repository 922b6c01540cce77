"""JSON-lines logging: our events, and everything else a process prints once its entry
point has routed the standard logging module, warnings and uncaught exceptions."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import pytest
from aws_xray_sdk.core.sampling.rule_cache import RuleCache
from aws_xray_sdk.core.sampling.rule_poller import RulePoller
from botocore.exceptions import EndpointConnectionError

from wsfleet import logs


def test_a_record_with_an_exception_becomes_one_json_line_with_the_traceback_in_a_field():
    try:
        raise ValueError("bad frame")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("websockets.client", logging.ERROR, __file__, 1, "closing %s", ("c1",), exc_info)

    line = logs.JsonFormatter(worker_id="w1").format(record)

    assert "\n" not in line
    event = json.loads(line)
    assert {k: event[k] for k in ("level", "event", "worker_id", "logger", "message")} == {
        "level": "error",
        "event": "log",
        "worker_id": "w1",
        "logger": "websockets.client",
        "message": "closing c1",
    }
    assert event["traceback"].startswith("Traceback (most recent call last):\n")
    assert event["traceback"].endswith("ValueError: bad frame")


def test_a_records_extra_fields_and_event_name_become_fields_of_its_line():
    out = io.StringIO()
    logger = logging.getLogger("wsfleet.test_logs")
    handler = logs.JsonLinesHandler(out, component="demo")
    logger.addHandler(handler)
    try:
        logger.warning("sample failed", extra={"event": "observer_sample_failed", "attempt": 2})
    finally:
        logger.removeHandler(handler)

    (event,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert event["event"] == "observer_sample_failed" and event["attempt"] == 2 and event["component"] == "demo"


class UnreachableDaemon:
    """The X-Ray SDK's connector as it behaves with no daemon at the address."""

    def fetch_sampling_rules(self):
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:2000/GetSamplingRules")


@pytest.fixture
def sdk_output(monkeypatch):
    """The X-Ray SDK's records as JSON lines in a buffer, through a fresh once-filter
    (and only that one: an earlier test may have routed this process's logging)."""
    out = io.StringIO()
    once = logs.XraySamplingUnavailable()
    for name in once.LOGGERS:
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    once.install()
    handler = logs.JsonLinesHandler(out, worker_id="w1")
    sdk = logging.getLogger("aws_xray_sdk")
    sdk.addHandler(handler)
    yield out, once
    sdk.removeHandler(handler)


def test_the_xray_sampling_poller_failing_on_every_poll_is_reported_once(sdk_output):
    out, once = sdk_output
    poller = RulePoller(RuleCache(), UnreachableDaemon())  # the SDK's own poller and message

    for _ in range(5):
        poller._refresh_cache()
    logging.getLogger("aws_xray_sdk.core.sampling.target_poller").error(
        "Encountered an issue while polling targets.", exc_info=True
    )

    (event,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert (event["event"], event["level"], event["worker_id"]) == ("xray_sampling_unavailable", "warning", "w1")
    assert event["detail"].startswith("EndpointConnectionError: Could not connect")
    assert "traceback" not in event
    assert once.suppressed == 5


def test_other_records_of_the_xray_sdk_still_pass_the_once_filter(sdk_output):
    out, _ = sdk_output
    poller_log = logging.getLogger("aws_xray_sdk.core.sampling.rule_poller")

    RulePoller(RuleCache(), UnreachableDaemon())._refresh_cache()
    poller_log.warning("Something else about sampling rules.")
    logging.getLogger("aws_xray_sdk.core.context").warning("No segment to end")

    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["event"], e["message"]) for e in events[1:]] == [
        ("log", "Something else about sampling rules."),
        ("log", "No segment to end"),
    ]


# What the hooks catch, in a process of its own: pytest installs hooks of its own.
MISBEHAVING_PROGRAM = """
import asyncio, threading, warnings
from wsfleet.logs import route_stdlib_logging

route_stdlib_logging(component="script")
warnings.warn("an old setting", UserWarning)

async def main():
    asyncio.get_running_loop().call_soon(lambda: 1 / 0)
    await asyncio.sleep(0.01)

asyncio.run(main())

def poll():
    raise ConnectionError("daemon gone")

thread = threading.Thread(target=poll, name="poller")
thread.start()
thread.join()

class Resource:
    def __del__(self):
        raise OSError("close failed")

Resource()
raise RuntimeError("the end")
"""


@pytest.mark.slow
def test_a_process_that_warns_and_fails_every_way_prints_only_json_lines(python_env):
    proc = subprocess.run(
        [sys.executable, "-c", MISBEHAVING_PROGRAM], env=python_env, capture_output=True, text=True, timeout=30
    )

    assert proc.returncode == 1 and proc.stderr == ""
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(e["event"], e["logger"]) for e in events] == [
        ("python_warning", "py.warnings"),
        ("log", "asyncio"),
        ("uncaught_exception", "wsfleet.uncaught"),
        ("unraisable_exception", "wsfleet.uncaught"),
        ("uncaught_exception", "wsfleet.uncaught"),
    ]
    assert all(e["component"] == "script" for e in events)
    assert "an old setting" in events[0]["message"]
    tracebacks = [e["traceback"].splitlines()[-1] for e in events[1:]]
    assert tracebacks == [
        "ZeroDivisionError: division by zero",
        "ConnectionError: daemon gone",
        "OSError: close failed",
        "RuntimeError: the end",
    ]
    assert events[2]["thread_name"] == "poller"
