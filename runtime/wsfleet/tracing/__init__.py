"""Tracing, one module deciding: ``TRACING`` (parsed by :mod:`wsfleet.config`) picks the
backend once per process, and no other file imports a tracing library.

* ``xray-sdk`` (the default until the X-Ray SDK's end of support, 2027-02-25):
  :mod:`._xray`, the AWS X-Ray SDK sending segments to the daemon.
* ``otel``: :mod:`._otel`, the OpenTelemetry SDK with X-Ray trace ids, exporting OTLP
  as the standard ``OTEL_*`` variables say.
* ``off``: nothing is imported and every call here does nothing.

Until :func:`configure` (or :func:`configure_worker`) is called, tracing is off.

The trace context that crosses a process boundary (an SQS hint's ``AWSTraceHeader``,
a session item's ``trace_header``) is an X-Ray trace header,
``Root=1-xxxxxxxx-xxxxxxxxxxxxxxxxxxxxxxxx;Parent=xxxxxxxxxxxxxxxx;Sampled=1``, in
both modes. A header read from outside is checked by :func:`valid_header`: a malformed
or hostile one is ignored with a ``trace_header_ignored`` log line, never an exception.

Tracing never changes what the traced work does: a backend that raises while a span
starts, ends or is annotated (an SDK bug, a span processor's) leaves the work to run
untraced and its own result or exception untouched; the first such failure is logged
(``trace_failed``) and each is counted in ``TraceExportFailures``
(:func:`take_export_failures`).

Attributes are the caller's: connection ids, session ids, fences, reasons. Never a
secret, a header value, a URL (its query string may hold a token) or a frame's data.
"""

from __future__ import annotations

import contextvars
import logging
import re
import threading
from contextlib import contextmanager
from importlib.metadata import entry_points
from typing import Any, Callable, ContextManager, Iterator, Protocol

from ._base import (
    DEFAULT_OTLP_ENDPOINT,
    MODES,
    OFF,
    OTEL,
    OTLP,
    OTLP_NAMES,
    XRAY_SDK,
    Settings,
    Span,
    failed,
    reset_failures,
    take_failures,
)

__all__ = [
    "DEFAULT_OTLP_ENDPOINT",
    "MODES",
    "OFF",
    "OTEL",
    "OTLP",
    "OTLP_NAMES",
    "XRAY_SDK",
    "Settings",
    "Span",
    "configure",
    "configure_worker",
    "current_header",
    "exporter_installed",
    "flush",
    "invocation",
    "log_fields",
    "reset",
    "segment",
    "subsegment",
    "take_export_failures",
    "trace_id",
    "untraced",
    "valid_header",
]

HEADER_MAX = 256  # longer than any header X-Ray writes: a longer one is not read at all

_log = logging.getLogger("wsfleet.tracing")
_ROOT = re.compile(r"1-[0-9a-f]{8}-[0-9a-f]{24}")
_PARENT = re.compile(r"[0-9a-f]{16}")


class Backend(Protocol):
    def span(self, name: str, parent: str | None, attrs: dict[str, Any], root: bool) -> Any: ...
    def invocation(self, name: str, attrs: dict[str, Any]) -> Any: ...
    def current_header(self) -> str | None: ...
    def clear(self) -> None: ...
    def trace_id(self) -> str | None: ...
    def flush(self, timeout_s: float) -> bool: ...
    def shutdown(self) -> None: ...
    def annotate(self, span: Any, annotations: dict[str, Any]) -> None: ...
    def header(self, span: Any) -> str | None: ...
    def take_export_failures(self) -> int: ...


def exporter_installed(name: str) -> bool:
    """An OpenTelemetry span exporter of that entry point name is installed (no import)."""
    return any(True for _ in entry_points(group="opentelemetry_traces_exporter", name=name))


_backend: Backend | None = None
_lock = threading.Lock()


def configure(settings: Settings | str, service: str, *, worker: bool = False, exporters: list | None = None) -> None:
    """Choose the backend, once per process (a second call is ignored): ``settings`` as
    the configuration read them (or just a mode). ``worker``: segments belong to the
    asyncio task that opened them (the worker's thousand connection tasks each trace
    their own). ``exporters``: OpenTelemetry span exporters to use instead of the ones
    the settings name (tests)."""
    global _backend
    settings = Settings(settings) if isinstance(settings, str) else settings
    if settings.mode not in MODES:
        raise ValueError(f"unknown tracing mode {settings.mode!r}")
    with _lock:
        if _backend is not None:
            return
        if settings.mode == XRAY_SDK:
            from . import _xray

            _backend = _xray.Backend(service, worker=worker)
        elif settings.mode == OTEL:
            from . import _otel

            _backend = _otel.Backend(service, settings, exporters=exporters)


def configure_worker(settings: Settings | str, service: str, *, exporters: list | None = None) -> None:
    configure(settings, service, worker=True, exporters=exporters)


def reset() -> None:
    """Back to off, after flushing (tests, and a process that reconfigures)."""
    global _backend
    with _lock:
        backend, _backend = _backend, None
    reset_failures()
    if backend is not None:
        backend.shutdown()


_NOTHING = Span()


def segment(name: str, *, parent: str | None = None, **attrs: str | int | float | bool | None) -> ContextManager[Span]:
    """A unit of work of its own (acquire, connect, release, end_session): a new trace,
    or the child of ``parent`` (an X-Ray trace header, already checked by
    :func:`valid_header`). Open and close it in one task; the worker's segments need
    :func:`configure_worker`. An exception escaping the block is recorded and re-raised."""
    return _opened(lambda backend: backend.span(name, parent, _given(attrs), True))


def subsegment(name: str, **attrs: str | int | float | bool | None) -> ContextManager[Span]:
    """A child of the current span, or a no-op :class:`Span` where none is open."""
    return _opened(lambda backend: backend.span(name, None, _given(attrs), False))


def invocation(name: str, **attrs: str | int | float | bool | None) -> ContextManager[Span]:
    """The router's span for one Lambda invocation: in ``xray-sdk`` a subsegment of the
    invocation's segment; in ``otel`` a child of the invocation's trace
    (``_X_AMZN_TRACE_ID``, so API Gateway, Lambda and the router are one trace), its
    spans flushed before the invocation returns (a frozen Lambda would lose them)."""
    return _opened(lambda backend: backend.invocation(name, _given(attrs)))


@contextmanager
def _opened(opener: Callable[[Backend], ContextManager[Span]]) -> Iterator[Span]:
    """The backend's span around the caller's block, or none where the backend fails to
    open it; the block's own exception (a CancelledError too) is what leaves, whatever
    the backend raises while closing the span."""
    backend = _backend
    if backend is None:
        yield _NOTHING
        return
    try:
        manager = opener(backend)
        span = manager.__enter__()
    except Exception as exc:  # noqa: BLE001 - see the module's docstring
        failed("start", exc)
        yield _NOTHING
        return
    try:
        yield span
    except BaseException as work:
        try:
            manager.__exit__(type(work), work, work.__traceback__)
        except BaseException as exc:  # noqa: BLE001
            if exc is not work:
                failed("end", exc)
        raise
    try:
        manager.__exit__(None, None, None)
    except Exception as exc:  # noqa: BLE001
        failed("end", exc)


def untraced() -> contextvars.Context:
    """A copy of the current context with no span current, for a long-lived task started
    inside a span (a connection's holder, started by an acquire in a drain): its later
    work must not all land in that span's trace."""
    context = contextvars.copy_context()
    if _backend is not None:
        context.run(_backend.clear)
    return context


def current_header() -> str | None:
    """The X-Ray trace header of the span current in this task, to send along (a hint's
    ``AWSTraceHeader``), or None."""
    backend = _backend
    if backend is None:
        return None
    try:
        return backend.current_header()
    except Exception as exc:  # noqa: BLE001 - see the module's docstring
        failed("header", exc)
        return None


def trace_id() -> str | None:
    """The current span's trace id in X-Ray form (``1-xxxxxxxx-x…``), for log lines."""
    backend = _backend
    if backend is None:
        return None
    try:
        return backend.trace_id()
    except Exception:  # noqa: BLE001 - a log line must never fail for its trace id
        return None


def log_fields(header: str | None) -> dict[str, str]:
    """``trace_id`` of a span's header, for a log line about its work written after it
    closed (``lease_acquired``, ``connected``); nothing without one."""
    if not header or not header.startswith("Root="):
        return {}
    return {"trace_id": header[5:].partition(";")[0]}


def flush(timeout_s: float = 5.0) -> bool:
    """Send what is buffered (the worker's SIGTERM path); True if that finished in time
    (an export that failed is counted, see :func:`take_export_failures`)."""
    return _backend.flush(timeout_s) if _backend is not None else True


def take_export_failures() -> int:
    """Span exports that failed since the last call, and spans that failed to start, end
    or be annotated (the worker's ``TraceExportFailures``)."""
    backend = _backend
    return take_failures() + (backend.take_export_failures() if backend is not None else 0)


def valid_header(header: object, *, where: str) -> str | None:
    """``header`` as a canonical X-Ray trace header (Root, Parent, Sampled), or None with
    a ``trace_header_ignored`` log line when it is not one (``where`` says where it came
    from). None or empty is no header and logs nothing. Never raises."""
    if header is None or header == "":
        return None
    parsed = _parse(header)
    if parsed is None:
        shown = repr(header)[:80] if isinstance(header, str) else type(header).__name__
        _log.warning("A malformed trace header was ignored.", extra={"event": "trace_header_ignored", "where": where, "header": shown})
    return parsed


def _parse(header: object) -> str | None:
    if not isinstance(header, str) or len(header) > HEADER_MAX:
        return None
    fields: dict[str, str] = {}
    for part in header.split(";"):
        key, eq, value = part.strip().partition("=")
        if not eq or key in fields:
            return None
        fields[key] = value.strip()
    root, parent, sampled = fields.get("Root", ""), fields.get("Parent", ""), fields.get("Sampled", "?")
    if not (_ROOT.fullmatch(root) and _PARENT.fullmatch(parent) and sampled in ("0", "1", "?")):
        return None
    # "?": the sender left the decision to us; the header then says nothing about it.
    return f"Root={root};Parent={parent}" + (f";Sampled={sampled}" if sampled != "?" else "")


def _given(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attrs.items() if v is not None}
