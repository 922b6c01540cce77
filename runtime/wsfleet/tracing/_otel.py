"""``TRACING=otel``: the OpenTelemetry SDK, trace ids in X-Ray's form (the AWS id
generator) and X-Ray trace headers across processes (the AWS X-Ray propagator), so the
spans can go to X-Ray through a collector (the ADOT sidecar) or straight to X-Ray's OTLP
endpoint.

The standard variables are read by the SDK itself: ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` (the resource; ``SERVICE_NAME``'s value where neither names
one), ``OTEL_TRACES_SAMPLER`` / ``_ARG`` (the sampler; default parent-based always-on),
``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` / ``_HEADERS`` / ``_TIMEOUT`` (the OTLP/HTTP
exporter), ``OTEL_BSP_*`` (the batch processor). ``OTEL_TRACES_EXPORTER`` [otlp] is read
by :func:`wsfleet.config.tracing_settings`: ``otlp`` (OTLP/HTTP protobuf, the one
shipped), ``none``, or any installed exporter's entry point name (``console``).
``TRACING_FILE`` (wsfleet's, for local runs) replaces them with OTLP JSON lines in that
file (the standard file exporter).

Where the endpoint is X-Ray's own (``https://xray.<region>.amazonaws.com/v1/traces``, no
collector in between) each export request is signed with SigV4 (:mod:`._sigv4`).

A flush or a shutdown waits no longer than it is given, whatever the exporter does (a
collector down or a TCP blackhole: each OTLP request may take ``OTEL_EXPORTER_OTLP_TIMEOUT``,
10 s, and a flush sends every queued batch): the SDK's own ``force_flush`` ignores its
timeout (opentelemetry-python#4568), so it runs in a thread of its own, one at a time,
and a call made while one is still stuck does not wait on it again (the router flushes
at the end of every invocation: a slow collector costs one request its bound, not each).
The interpreter's exit shuts the provider down within :data:`SHUTDOWN_S`.

An export that fails never reaches the caller: it is counted
(:meth:`Backend.take_export_failures`, the worker's ``TraceExportFailures``) and logged
once per burst (``trace_export_failed``, then ``trace_export_recovered``); the SDK's own
per-failure error lines are folded into that one.
"""

from __future__ import annotations

import atexit
import logging
import re
import threading
from contextlib import contextmanager
from importlib.metadata import entry_points
from typing import Any, Iterator, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.aws import AwsXRayLambdaPropagator, AwsXRayPropagator
from opentelemetry.sdk.extension.aws.trace import AwsXRayIdGenerator
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from ..settings_spec import ConfigError
from ._base import OTLP_NAMES, Settings, Span

_XRAY_ENDPOINT = re.compile(r"https://xray\.([a-z0-9-]+)\.amazonaws\.com/v1/traces/?")
_HEADER = "X-Amzn-Trace-Id"
FLUSH_AT_INVOCATION_END_MS = 2000
SHUTDOWN_S = 2.0  # the provider's shutdown at exit (the SDK's own waits up to 30 s per processor)

_log = logging.getLogger("wsfleet.tracing")


class Backend:
    def __init__(self, service: str, settings: Settings, *, exporters: Sequence[SpanExporter] | None = None) -> None:
        resource = Resource.create({})
        if str(resource.attributes.get(SERVICE_NAME, "unknown_service")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: service}))
        self._provider = TracerProvider(resource=resource, id_generator=AwsXRayIdGenerator(), shutdown_on_exit=False)
        self._tracer = self._provider.get_tracer("wsfleet")
        self._propagator = AwsXRayPropagator()
        self._lambda = AwsXRayLambdaPropagator()
        self._failures = 0
        self._failures_lock = threading.Lock()
        self._flushing: threading.Thread | None = None
        self._flush_lock = threading.Lock()
        self._late = False
        if exporters is None:
            exporters = [file_exporter(settings.file)] if settings.file else [named(n, settings.endpoint) for n in settings.exporters]
        for exporter in exporters:
            self._provider.add_span_processor(BatchSpanProcessor(Reported(exporter, self._failed)))
        atexit.register(self.shutdown)

    # --- spans ---------------------------------------------------------------------------

    @contextmanager
    def span(self, name: str, parent: str | None, attrs: dict[str, Any], root: bool) -> Iterator[Span]:
        if root:
            context = self._propagator.extract({_HEADER: parent}) if parent else Context()
        elif not trace.get_current_span().get_span_context().is_valid:
            yield Span()  # as X-Ray's subsegment: nothing without an open span
            return
        else:
            context = None
        with self._tracer.start_as_current_span(name, context=context, attributes=attrs, **_NO_MESSAGES) as span:
            with _errors_by_type(span):
                yield Span(span, self)

    @contextmanager
    def invocation(self, name: str, attrs: dict[str, Any]) -> Iterator[Span]:
        context = self._lambda.extract({})  # _X_AMZN_TRACE_ID: the invocation's trace, if any
        try:
            with self._tracer.start_as_current_span(
                name, context=context, kind=trace.SpanKind.SERVER, attributes=attrs, **_NO_MESSAGES
            ) as span:
                with _errors_by_type(span):
                    yield Span(span, self)
        finally:
            self.flush(FLUSH_AT_INVOCATION_END_MS / 1000)

    @staticmethod
    def annotate(span: Any, annotations: dict[str, Any]) -> None:
        span.set_attributes(annotations)

    def header(self, span: Any) -> str | None:
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=trace.set_span_in_context(span))
        return carrier.get(_HEADER)

    def current_header(self) -> str | None:
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        return carrier.get(_HEADER)

    @staticmethod
    def clear() -> None:
        otel_context.attach(Context())  # in a context copy of its own: never detached

    def trace_id(self) -> str | None:
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        hex_id = f"{context.trace_id:032x}"
        return f"1-{hex_id[:8]}-{hex_id[8:]}"

    # --- export --------------------------------------------------------------------------

    def flush(self, timeout_s: float) -> bool:
        """Export what is queued, waiting at most ``timeout_s``; False if that did not
        finish in time, or if an earlier flush is still stuck (not waited on again).
        A late flush is logged once (``trace_flush_late``) until one finishes in time."""
        with self._flush_lock:
            if self._flushing is not None and self._flushing.is_alive():
                return self._was_late(timeout_s)
            done: list[bool] = []
            thread = threading.Thread(
                target=lambda: done.append(self._provider.force_flush()), name="wsfleet-trace-flush", daemon=True
            )
            self._flushing = thread
            thread.start()
        thread.join(max(0.0, timeout_s))
        if thread.is_alive():
            return self._was_late(timeout_s)
        self._late = False
        return bool(done and done[0])

    def _was_late(self, timeout_s: float) -> bool:
        if not self._late:
            self._late = True
            _log.warning(
                "Spans could not be flushed in time (the collector is slow or unreachable); later flushes do not wait "
                "while this one is stuck.",
                extra={"event": "trace_flush_late", "timeout_s": timeout_s},
            )
        return False

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Shut the provider down, waiting at most ``timeout_s`` [:data:`SHUTDOWN_S`]
        (also run at the interpreter's exit, once)."""
        atexit.unregister(self.shutdown)
        thread = threading.Thread(target=self._provider.shutdown, name="wsfleet-trace-shutdown", daemon=True)
        thread.start()
        thread.join(SHUTDOWN_S if timeout_s is None else timeout_s)

    def _failed(self) -> None:
        with self._failures_lock:
            self._failures += 1

    def take_export_failures(self) -> int:
        with self._failures_lock:
            taken, self._failures = self._failures, 0
        return taken


class Reported(SpanExporter):
    """Wraps an exporter so that no failure escapes: each one counted, one log line per
    burst of them with the exporter's own reason, which its logger no longer prints."""

    def __init__(self, inner: SpanExporter, on_failure: Any) -> None:
        self._inner = inner
        self._on_failure = on_failure
        self._failing = False
        self._reason = _LastReason()
        self._logger = logging.getLogger(type(inner).__module__)
        self._logger.addFilter(self._reason)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
            error = None
        except Exception as exc:  # noqa: BLE001 - an exporter's bug must not reach the worker
            result, error = SpanExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
        if result is SpanExportResult.SUCCESS:
            if self._failing:
                self._failing = False
                _log.warning("Span export works again.", extra={"event": "trace_export_recovered"})
            return result
        self._on_failure()
        if not self._failing:
            self._failing = True
            _log.warning(
                "Spans could not be exported; failures are counted (TraceExportFailures) and not logged again until "
                "an export succeeds.",
                extra={"event": "trace_export_failed", "exporter": type(self._inner).__name__, "detail": error or self._reason.last},
            )
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._inner.shutdown()
        self._logger.removeFilter(self._reason)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _LastReason(logging.Filter):
    """Keeps the exporter's last error message and drops its line."""

    def __init__(self) -> None:
        super().__init__()
        self.last: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        try:
            self.last = record.getMessage()[:500]
        except (TypeError, ValueError):
            self.last = str(record.msg)[:500]
        return False


def named(name: str, endpoint: str) -> SpanExporter:
    """The exporter of that name (checked by :func:`wsfleet.config.tracing_settings`)."""
    if name in OTLP_NAMES:
        return otlp_exporter(endpoint)
    (found, *_) = entry_points(group="opentelemetry_traces_exporter", name=name)
    return found.load()()


def file_exporter(path: str) -> SpanExporter:
    """``TRACING_FILE`` (local runs, ``make demo``): OTLP JSON lines appended to ``path``
    by the standard file exporter, a development package (requirements-dev.txt)."""
    try:
        from opentelemetry.exporter.otlp.json.file import FileSpanExporter
    except ImportError:
        raise ConfigError(
            "TRACING_FILE needs the opentelemetry-exporter-otlp-json-file package (requirements-dev.txt)"
        ) from None
    try:
        return FileSpanExporter(path)
    except OSError as exc:
        raise ConfigError(f"TRACING_FILE cannot be opened for appending: {exc}") from None


def otlp_exporter(endpoint: str) -> SpanExporter:
    """OTLP/HTTP protobuf (its endpoint read by the SDK itself), signed with SigV4 where
    the endpoint is X-Ray's own."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    region = xray_region(endpoint)
    if region is None:
        return OTLPSpanExporter()
    from ._sigv4 import SigV4Session

    return OTLPSpanExporter(session=SigV4Session(region))


def xray_region(endpoint: str) -> str | None:
    """The region of X-Ray's own OTLP endpoint, or None for any other (a collector)."""
    match = _XRAY_ENDPOINT.fullmatch(endpoint)
    return match.group(1) if match else None


# The SDK would record an exception's message and stack text on the span; a message can
# hold what spans must never carry (a URL's query string in websockets' InvalidURI, a
# header value). The exception's type is recorded instead (the log line has the rest).
_NO_MESSAGES = {"record_exception": False, "set_status_on_exception": False}


@contextmanager
def _errors_by_type(span: Any) -> Iterator[None]:
    try:
        yield
    except BaseException as exc:
        kind = type(exc).__qualname__
        try:
            span.add_event("exception", {"exception.type": kind})
            if isinstance(exc, Exception):
                span.set_status(trace.Status(trace.StatusCode.ERROR, kind))
        except Exception:  # noqa: BLE001 - the work's own exception is what leaves
            pass
        raise
