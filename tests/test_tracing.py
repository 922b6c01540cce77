"""wsfleet.tracing: one module deciding TRACING, the otel backend (export failures, SigV4 to
X-Ray's endpoint, the Lambda invocation's trace), trace headers read from outside, and
log lines carrying the trace id. In-process, no emulator (see test_tracing_trace for the
traces across SQS and the sessions table)."""

from __future__ import annotations

import ast
import http.server
import io
import json
import logging
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from botocore.credentials import Credentials
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from wsfleet import router as router_module
from wsfleet import tracing
from wsfleet.config import RouterConfig, WorkerConfig, otlp_traces_endpoint
from wsfleet.settings_spec import ConfigError
from wsfleet.logs import JsonLogger
from wsfleet.metrics import metric_data
from wsfleet.tracing import _otel
from wsfleet.tracing._sigv4 import SigV4Session
from wsfleet.worker import __main__ as worker_main
from wsfleet.worker.intake import Intake

from tests.test_config import BASE

ROOT = Path(__file__).resolve().parents[1]
HEADER = "Root=1-6565e1a0-0123456789abcdef01234567;Parent=1111111111111111;Sampled=1"


@pytest.fixture
def otel(otel_spans):
    return otel_spans


# --- one module deciding -------------------------------------------------------------------


def test_no_runtime_file_outside_the_tracing_package_imports_a_tracing_library():
    offenders = []
    # The package's sources, not the tree under runtime/: `pip install ./runtime` leaves a
    # copy in runtime/build/, which is no source of ours.
    for path in [*(ROOT / "runtime/wsfleet").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]:
        if (ROOT / "runtime/wsfleet/tracing") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in ("aws_xray_sdk", "opentelemetry")]
    assert offenders == []


OFF_PROBE = """
import sys
from wsfleet import router, tracing
from wsfleet.config import WorkerConfig
from wsfleet.worker import __main__, lifecycle, connection, intake, takeover
config = WorkerConfig.from_env()
tracing.configure_worker(config.tracing, config.service_name)
with tracing.segment("acquire", connection_id="a") as span:
    with tracing.subsegment("call") as inner:
        recorded = span.recording or inner.recording or tracing.current_header() or tracing.trace_id()
print(config.tracing.mode, bool(recorded), sorted({m.split(".")[0] for m in sys.modules} & {"aws_xray_sdk", "opentelemetry"}))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "env, mode",
    [({"TRACING": "off"}, "off"), ({"TRACING": "xray-sdk", "AWS_XRAY_SDK_ENABLED": "false"}, "off")],
    ids=["off", "xray-sdk-disabled"],
)
def test_off_imports_no_tracing_library_and_records_nothing(env, mode):
    child_env = {"PYTHONPATH": str(ROOT / "runtime"), "PATH": "/usr/bin:/bin", **BASE, **env}
    out = subprocess.run([sys.executable, "-c", OFF_PROBE], env=child_env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [mode, "False", "[]"]


def test_tracing_defaults_to_the_xray_sdk_and_a_bad_value_is_an_error_naming_it():
    assert WorkerConfig.from_env(BASE).tracing == RouterConfig.from_env(BASE).tracing == tracing.Settings("xray-sdk")
    assert WorkerConfig.from_env({**BASE, "TRACING": "OTel "}).tracing == tracing.Settings("otel")
    for config in (WorkerConfig, RouterConfig):
        with pytest.raises(ConfigError, match=r"^TRACING must be one of xray-sdk, otel, off, got 'jaeger'$"):
            config.from_env({**BASE, "TRACING": "jaeger"})


def test_the_worker_refuses_to_start_on_a_bad_tracing_setting(monkeypatch, capsys):
    for key, value in {**BASE, "TRACING": "otel", "OTEL_TRACES_EXPORTER": "zipkin"}.items():
        monkeypatch.setenv(key, value)
    tracing.reset()
    assert worker_main.main() == 2
    err = capsys.readouterr().err
    assert "OTEL_TRACES_EXPORTER names an exporter that is not installed: 'zipkin'" in err and "Traceback" not in err
    monkeypatch.setenv("TRACING", "zipkin")
    assert worker_main.main() == 2
    assert "TRACING must be one of" in capsys.readouterr().err
    tracing.reset()


def test_the_router_answers_a_bad_tracing_setting_with_a_500_naming_it(monkeypatch):
    for key, value in {**BASE, "TRACING": "nope"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(router_module, "_router", None)
    answer = router_module.handler({"httpMethod": "GET", "path": "/connections/x"}, None)
    assert answer["statusCode"] == 500
    assert "TRACING must be one of" in json.loads(answer["body"])["message"]


def test_the_otel_settings_are_read_with_the_others_and_a_bad_one_names_its_variable():
    otel = {**BASE, "TRACING": "otel"}
    with pytest.raises(ConfigError, match=r"^OTEL_EXPORTER_OTLP_PROTOCOL must be http/protobuf \(the OTLP exporter shipped\), got 'grpc'$"):
        WorkerConfig.from_env({**otel, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    with pytest.raises(ConfigError, match="^TRACING_FILE needs TRACING=otel, got TRACING=off$"):
        RouterConfig.from_env({**BASE, "TRACING": "off", "TRACING_FILE": "/tmp/t.jsonl"})
    assert WorkerConfig.from_env({**otel, "OTEL_TRACES_EXPORTER": "none"}).tracing.exporters == ()
    settings = RouterConfig.from_env({**otel, "OTEL_TRACES_EXPORTER": "console,otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}).tracing
    assert (settings.exporters, settings.endpoint) == (("console", "otlp"), "http://c:4318/v1/traces")
    assert type(_otel.named("console", settings.endpoint)).__name__ == "ConsoleSpanExporter"
    assert WorkerConfig.from_env(otel).tracing.endpoint == "http://localhost:4318/v1/traces"


# --- trace headers from outside -----------------------------------------------------------


@pytest.mark.parametrize(
    "given, read",
    [
        (HEADER, HEADER),
        ("Sampled=1; Parent=1111111111111111 ;Root=1-6565e1a0-0123456789abcdef01234567;Lineage=a:1", HEADER),
        ("Root=1-6565e1a0-0123456789abcdef01234567;Parent=1111111111111111;Sampled=?", HEADER.rsplit(";", 1)[0]),
    ],
)
def test_a_trace_header_is_read_in_its_canonical_form(given, read):
    assert tracing.valid_header(given, where="test") == read


@pytest.mark.parametrize(
    "hostile",
    [
        "garbage",
        HEADER + ";Root=1-6565e1a0-0123456789abcdef01234567",  # a key twice
        HEADER.replace("Root=1-", "Root=2-"),
        HEADER.replace("1111111111111111", "11111111111111zz"),
        HEADER.replace("Sampled=1", "Sampled=yes"),
        HEADER + ";Pad=" + "x" * 300,
        {"Root": "1-6565e1a0-0123456789abcdef01234567"},
        12,
    ],
)
def test_a_hostile_or_malformed_trace_header_is_ignored_with_a_log_line(hostile, caplog):
    with caplog.at_level(logging.WARNING, logger="wsfleet.tracing"):
        assert tracing.valid_header(hostile, where="hint") is None
    (record,) = caplog.records
    assert (record.event, record.where) == ("trace_header_ignored", "hint")
    assert len(record.header) <= 80
    assert tracing.valid_header(None, where="hint") is None and tracing.valid_header("", where="hint") is None


def test_a_hint_with_a_hostile_trace_header_is_still_taken_without_its_trace(caplog):
    taken = []

    async def acquire(connection_id, **kwargs):
        taken.append((connection_id, kwargs["trace_parent"]))

    class Sqs:
        def delete_message(self, **_):
            pass

    class Aws:
        sqs = Sqs()

        async def call(self, fn, /, *args, **kwargs):
            return fn(*args, **kwargs)

    from types import SimpleNamespace

    from wsfleet.worker.holdings import Holdings
    from wsfleet.worker.summary import FleetSummary

    intake = Intake(
        aws=Aws(), queue_url="q", log=JsonLogger(io.StringIO()),
        holdings=Holdings(max_connections=5, summary=FleetSummary()),
        acquisition=SimpleNamespace(try_acquire=acquire, accepting=lambda: True),
        keeper=SimpleNamespace(session_id=""), takeover=SimpleNamespace(note_work=lambda: None),
    )
    import asyncio

    hostile = {"Body": json.dumps({"connection_id": "c1"}), "ReceiptHandle": "r", "Attributes": {"AWSTraceHeader": "Root=evil"}}
    good = {"Body": json.dumps({"connection_id": "c2"}), "ReceiptHandle": "r", "Attributes": {"AWSTraceHeader": HEADER}}
    with caplog.at_level(logging.WARNING, logger="wsfleet.tracing"):
        asyncio.run(intake._on_hint(hostile))
        asyncio.run(intake._on_hint(good))
    assert taken == [("c1", None), ("c2", HEADER)]
    assert [r.event for r in caplog.records] == ["trace_header_ignored"]


# --- the otel backend ----------------------------------------------------------------------


def test_a_segment_with_a_parent_header_continues_that_trace_and_subsegments_need_an_open_span(otel):
    with tracing.segment("acquire", parent=HEADER, connection_id="c1", fence=3, session="s#1") as span:
        assert tracing.current_header() == span.header
        with tracing.subsegment("ConnectionsStore.acquire"):
            pass
    with tracing.subsegment("alone"):  # no span open: nothing, as X-Ray's subsegment
        pass
    with tracing.segment("connect", parent=span.header):
        pass
    inner, acquire, connect = otel()
    assert f"{acquire.context.trace_id:032x}" == "6565e1a00123456789abcdef01234567"
    assert acquire.parent.span_id == 0x1111111111111111 and acquire.parent.is_remote
    assert inner.parent.span_id == acquire.context.span_id
    assert connect.parent.span_id == acquire.context.span_id and connect.context.trace_id == acquire.context.trace_id
    assert dict(acquire.attributes) == {"connection_id": "c1", "fence": 3, "session": "s#1"}
    assert span.header.startswith("Root=1-6565e1a0-0123456789abcdef01234567;Parent=")


def test_a_segment_without_a_parent_starts_a_trace_with_an_xray_id(otel):
    with tracing.segment("release") as first:
        with tracing.segment("drain") as second:  # a segment is never nested implicitly
            pass
    spans = otel()
    assert len({s.context.trace_id for s in spans}) == 2 and all(s.parent is None for s in spans)
    assert first.header != second.header
    # X-Ray ids: the first 32 bits are the start time in seconds.
    import time

    assert abs((spans[0].context.trace_id >> 96) - time.time()) < 600


def test_the_routers_span_continues_the_lambda_invocations_trace_and_is_flushed_before_it_returns(monkeypatch):
    memory = InMemorySpanExporter()
    tracing.reset()
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")  # only the invocation's own flush sends it
    tracing.configure("otel", "wsfleet-router", exporters=[memory])
    monkeypatch.setenv("_X_AMZN_TRACE_ID", HEADER + ";Lineage=1a2b3c4d:0")
    try:
        with tracing.invocation("router", method="POST") as span:
            span.annotate(status=202, outcome=None)
        (router,) = memory.get_finished_spans()
    finally:
        tracing.reset()
    assert f"{router.context.trace_id:032x}" == "6565e1a00123456789abcdef01234567"
    assert router.parent.span_id == 0x1111111111111111
    assert (router.kind.name, dict(router.attributes)) == ("SERVER", {"method": "POST", "status": 202})


def test_the_standard_variables_name_the_service_and_sample(monkeypatch):
    memory = InMemorySpanExporter()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-otel")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    tracing.reset()
    tracing.configure_worker("otel", "wsfleet-worker", exporters=[memory])
    try:
        with tracing.segment("acquire") as span:
            assert not span._entity.is_recording()
        assert tracing.flush() and memory.get_finished_spans() == ()
        monkeypatch.delenv("OTEL_TRACES_SAMPLER")
        tracing.reset()
        memory = InMemorySpanExporter()
        tracing.configure_worker("otel", "wsfleet-worker", exporters=[memory])
        with tracing.segment("acquire"):
            pass
        tracing.flush()
        (span,) = memory.get_finished_spans()
        assert span.resource.attributes["service.name"] == "from-otel"
    finally:
        tracing.reset()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_failed_exports_are_counted_and_logged_once_per_burst_never_raised(caplog):
    class Flaky(SpanExporter):
        def __init__(self):
            self.answers = ["raise", SpanExportResult.SUCCESS]

        def export(self, spans):
            answer = self.answers.pop(0) if self.answers else SpanExportResult.SUCCESS
            if answer == "raise":
                raise RuntimeError("exporter bug")
            return answer

    unreachable = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{_closed_port()}/v1/traces", timeout=0.5)
    flaky = Flaky()
    tracing.reset()
    tracing.configure_worker("otel", "wsfleet-test", exporters=[unreachable, flaky])
    try:
        with caplog.at_level(logging.INFO):
            for n in range(3):
                with tracing.segment("acquire", connection_id=f"c{n}"):
                    pass
                assert tracing.flush()  # the unreachable one failed: counted, nothing raised here
        failures = tracing.take_export_failures()
    finally:
        tracing.reset()
    assert failures == 4  # three to the unreachable collector, one exporter bug
    assert tracing.take_export_failures() == 0
    events = [(getattr(r, "event", None), getattr(r, "exporter", None)) for r in caplog.records if r.levelno >= logging.WARNING]
    assert events == [
        ("trace_export_failed", "OTLPSpanExporter"),
        ("trace_export_failed", "Flaky"),
        ("trace_export_recovered", None),
    ]
    (unreachable_line,) = [r for r in caplog.records if getattr(r, "exporter", None) == "OTLPSpanExporter"]
    assert unreachable_line.detail  # the exporter's own reason, its own line folded into this one
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]


def test_export_failures_are_published_as_a_metric_only_when_there_are_some():
    names_of = lambda data: {d["MetricName"] for d in data}  # noqa: E731
    assert "TraceExportFailures" not in names_of(metric_data(service_name="s", active_connections=0, deltas={}))
    data = metric_data(service_name="s", active_connections=0, deltas={}, trace_export_failures=3)
    (failures,) = [d for d in data if d["MetricName"] == "TraceExportFailures"]
    assert failures["Value"] == 3.0


class _Collector(http.server.BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((dict(self.headers), body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_exports_to_xrays_own_endpoint_are_signed_with_sigv4():
    assert _otel.xray_region(otlp_traces_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://xray.eu-west-1.amazonaws.com"})) == "eu-west-1"
    assert _otel.xray_region(otlp_traces_endpoint({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://xray.us-east-1.amazonaws.com/v1/traces"})) == "us-east-1"
    assert _otel.xray_region(otlp_traces_endpoint({})) is None  # a collector: not signed
    # Exporting there: the exporter built for it signs (its session is ours).
    assert isinstance(_otel.otlp_exporter("https://xray.eu-west-1.amazonaws.com/v1/traces")._client._transport._session, SigV4Session)
    assert _otel.xray_region("https://xray.us-east-1.amazonaws.com.evil.example/v1/traces") is None

    _Collector.received = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        session = SigV4Session("eu-west-1", credentials=Credentials("AKIDEXAMPLE", "secret-key-example"))
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{server.server_port}/v1/traces", session=session)
        tracing.reset()
        tracing.configure_worker("otel", "wsfleet-test", exporters=[exporter])
        with tracing.segment("acquire", connection_id="c1"):
            pass
        assert tracing.flush()
    finally:
        tracing.reset()
        server.shutdown()
    ((headers, body),) = _Collector.received
    assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/xray/aws4_request" in headers["Authorization"] and "X-Amz-Date" in headers
    request = ExportTraceServiceRequest.FromString(body)
    assert [s.name for r in request.resource_spans for ss in r.scope_spans for s in ss.spans] == ["acquire"]


# --- log lines carry the trace id ----------------------------------------------------------


def test_log_lines_written_under_a_span_carry_its_trace_id_in_xray_form(otel):
    out = io.StringIO()
    log = JsonLogger(out)
    log.info("before")
    with tracing.segment("acquire", parent=HEADER):
        log.info("inside")
        logging.getLogger("wsfleet.test").warning("a library's line")
    before, inside = (json.loads(line) for line in out.getvalue().splitlines())
    assert "trace_id" not in before
    assert inside["trace_id"] == "1-6565e1a0-0123456789abcdef01234567"
    from wsfleet.logs import JsonFormatter

    record = logging.makeLogRecord({"msg": "x", "levelname": "WARNING", "levelno": 30})
    with tracing.segment("connect", parent=HEADER):
        assert json.loads(JsonFormatter().format(record))["trace_id"] == "1-6565e1a0-0123456789abcdef01234567"


def test_a_failed_blocks_message_is_not_in_its_span_only_its_type(otel_spans):
    with pytest.raises(ValueError, match="s3cr3t"):
        with tracing.segment("connect", connection_id="c1"):
            with tracing.subsegment("secrets.get"):
                raise ValueError("bad URI wss://up.example/feed?token=s3cr3t")
    spans = otel_spans()
    assert {s.name for s in spans} == {"connect", "secrets.get"}
    for span in spans:
        assert "s3cr3t" not in span.to_json()
        assert [dict(e.attributes) for e in span.events] == [{"exception.type": "ValueError"}]
        assert span.status.status_code.name == "ERROR"
