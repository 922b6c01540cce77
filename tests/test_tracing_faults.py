"""Tracing must never hurt the fleet: a hung exporter, a backend that raises, hostile
trace headers (an adversarial review of issue 23's tracing)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import pytest
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from wsfleet import router as router_module
from wsfleet import tracing
from wsfleet.config import WorkerConfig
from wsfleet.settings_spec import ConfigError
from wsfleet.tracing import _otel
from wsfleet.worker import __main__ as worker_main

from tests.test_config import BASE
from tests.test_tracing_worker import configure, emitter  # noqa: F401 - the X-Ray fixture


class Hung(SpanExporter):
    """A collector that takes a connection and never answers (a TCP blackhole), until
    ``release`` is set (the test's own deadline, so that nothing waits forever)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def export(self, spans):
        self.calls += 1
        self.release.wait(8)
        return SpanExportResult.FAILURE

    def shutdown(self):
        pass


@pytest.fixture
def hung():
    exporter = Hung()
    tracing.reset()
    yield exporter
    exporter.release.set()
    tracing.reset()


def _elapsed(fn, *args):
    started = time.monotonic()
    result = fn(*args)
    return result, time.monotonic() - started


def test_a_flush_to_a_hung_exporter_returns_by_its_timeout(hung):
    tracing.configure_worker("otel", "wsfleet-test", exporters=[hung])
    with tracing.segment("release", connection_id="c1"):
        pass
    flushed, took = _elapsed(tracing.flush, 0.3)
    assert flushed is False and took < 3.0, took  # the SDK's own force_flush waits for the export
    assert hung.calls == 1


def test_the_routers_flush_waits_at_most_its_bound_and_not_again_while_one_is_stuck(hung, monkeypatch):
    monkeypatch.setattr(_otel, "FLUSH_AT_INVOCATION_END_MS", 300)
    tracing.configure("otel", "wsfleet-router", exporters=[hung])

    def invoke():
        with tracing.invocation("router", method="POST"):
            pass

    _, first = _elapsed(invoke)
    assert first < 3.0, first
    monkeypatch.setattr(_otel, "FLUSH_AT_INVOCATION_END_MS", 5000)
    _, second = _elapsed(invoke)  # the collector is still stuck: this request does not wait on it
    assert second < 2.5, second


def test_shutdown_with_a_hung_exporter_is_bounded(hung, monkeypatch):
    monkeypatch.setattr(_otel, "SHUTDOWN_S", 0.3)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    tracing.configure_worker("otel", "wsfleet-test", exporters=[hung])
    with tracing.segment("release"):
        pass
    deadline = time.monotonic() + 10
    while hung.calls == 0 and time.monotonic() < deadline:  # the processor's own thread is stuck in it
        time.sleep(0.02)
    assert hung.calls == 1
    _, took = _elapsed(tracing.reset)  # what the interpreter's exit runs too
    assert took < 3.0, took


# --- the batch processor's variables ---------------------------------------------------------


@pytest.mark.parametrize(
    "bad, named",
    [
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "0"}, "OTEL_BSP_MAX_QUEUE_SIZE"),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "lots"}, "OTEL_BSP_MAX_QUEUE_SIZE"),
        ({"OTEL_BSP_SCHEDULE_DELAY": "-1"}, "OTEL_BSP_SCHEDULE_DELAY"),
        ({"OTEL_BSP_EXPORT_TIMEOUT": "soon"}, "OTEL_BSP_EXPORT_TIMEOUT"),
        ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "5000"}, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "200"}, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
    ],
)
def test_a_bad_batch_processor_variable_is_a_config_error_naming_it(bad, named):
    with pytest.raises(ConfigError, match=f"^{named} "):
        WorkerConfig.from_env({**BASE, "TRACING": "otel", **bad})
    assert WorkerConfig.from_env({**BASE, "TRACING": "off", **bad}).tracing.mode == "off"  # not read unless otel


def test_the_worker_and_the_router_refuse_a_batch_size_the_sdk_would_raise_on(monkeypatch, capsys):
    for key, value in {**BASE, "TRACING": "otel", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "5000"}.items():
        monkeypatch.setenv(key, value)
    tracing.reset()
    try:
        assert worker_main.main() == 2
        err = capsys.readouterr().err
        assert "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" in err and "Traceback" not in err
        monkeypatch.setattr(router_module, "_router", None)
        answer = router_module.handler({"httpMethod": "GET", "path": "/connections/x"}, None)
    finally:
        tracing.reset()
    assert answer["statusCode"] == 500
    assert "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" in json.loads(answer["body"])["message"]


# --- a backend that fails ------------------------------------------------------------------


class Broken(Exception):
    pass


@pytest.fixture
def breaking(otel_spans, monkeypatch):
    """The otel backend, made to fail where it is told: ``start``, ``end``, ``annotate``,
    ``header`` (the current one, that a hint carries)."""
    backend = tracing._backend
    real_span, real_annotate, real_current_header = backend.span, backend.annotate, backend.current_header
    where: set[str] = set()

    @contextlib.contextmanager
    def span(*args):
        if "start" in where:
            raise Broken("start")
        with real_span(*args) as opened:
            try:
                yield opened
            finally:
                if "end" in where:
                    raise Broken("end")

    def annotate(entity, annotations):
        if "annotate" in where:
            raise Broken("annotate")
        real_annotate(entity, annotations)

    def current_header():
        if "header" in where:
            raise Broken("header")
        return real_current_header()

    monkeypatch.setattr(backend, "span", span)
    monkeypatch.setattr(backend, "annotate", annotate)
    monkeypatch.setattr(backend, "current_header", current_header)
    return where


@pytest.mark.parametrize("fails", [{"start"}, {"end"}, {"annotate"}, {"header"}, {"start", "end", "annotate", "header"}])
def test_a_failing_backend_never_changes_what_the_traced_work_does(breaking, fails, caplog):
    breaking.update(fails)
    ran = []
    with tracing.segment("acquire", connection_id="c1") as span:
        span.annotate(outcome="acquired")
        ran.append(tracing.current_header())
    assert len(ran) == 1
    with pytest.raises(KeyError, match="the work's own"):  # the work's error, not tracing's
        with tracing.segment("release"):
            raise KeyError("the work's own")
    with pytest.raises(asyncio.CancelledError):
        with tracing.subsegment("aws_call"):
            raise asyncio.CancelledError()
    assert tracing.take_export_failures() >= 1
    (line,) = [r for r in caplog.records if getattr(r, "event", None) == "trace_failed"]  # once, then counted
    assert "Broken" in line.detail


# --- a task that outlives the segment it was started in ------------------------------------


def test_a_task_that_outlives_its_creators_segment_calls_aws_untraced_not_into_the_ended_segment(emitter):  # noqa: F811
    """A task started inside a segment (a batch sent for the first of its askers, a shared
    secret fetch, a retry's attempt) that makes a call after that segment ended: X-Ray's
    ``add_subsegment`` raises AlreadyEndedException on an ended segment, which failed the
    call itself before tracing was made harmless, and is still a tracing failure."""
    segment_ended = None

    async def main():
        nonlocal segment_ended
        configure(emitter)
        go = asyncio.Event()

        async def late_call():
            await go.wait()
            with tracing.subsegment("ConnectionsStore.acquire") as span:
                return span.recording, tracing.current_header()

        with tracing.segment("acquire", connection_id="c1"):
            late = asyncio.create_task(late_call())
        segment_ended = [s["name"] for s in emitter.sent]
        go.set()
        return await late

    recording, header = asyncio.run(main())
    assert segment_ended == ["acquire"]
    assert (recording, header) == (False, None)
    assert tracing.take_export_failures() == 0
    assert [s["name"] for s in emitter.sent] == ["acquire"]  # not sent again with a late subsegment
