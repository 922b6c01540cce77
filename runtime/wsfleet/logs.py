"""JSON-lines logging: one event per line on stdout, with ``event`` and, where they
apply, ``worker_id``, ``connection_id`` and ``trace_id`` (the current span's trace, in
X-Ray's ``1-xxxxxxxx-…`` form, to paste into the X-Ray console).

Our own code logs through :class:`JsonLogger`. Everything else a process prints (records
of the standard ``logging`` module from botocore, websockets, asyncio and the X-Ray SDK,
warnings, exceptions nothing caught) becomes a line of the same shape once the entry
point has called :func:`route_stdlib_logging`, so every line of output parses as JSON.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any, TextIO

from . import tracing

# One lock for every line a process writes, so a line from a library's thread is never
# interleaved with one from the event loop.
_write_lock = threading.Lock()


def _line(level: str, event: str, fields: dict[str, Any], ts: float | None = None) -> str:
    record = {"ts": round(time.time() if ts is None else ts, 3), "level": level, "event": event, **fields}
    trace_id = tracing.trace_id()
    if trace_id is not None:  # written while a span is current: the line leads to its trace
        record.setdefault("trace_id", trace_id)
    return json.dumps(record, default=str, separators=(",", ":"))


def _write(stream: TextIO | None, line: str) -> None:
    stream = stream or sys.stdout  # looked up per line: a replaced sys.stdout is honoured
    try:
        with _write_lock:
            stream.write(line + "\n")
            stream.flush()
    except (OSError, ValueError):
        pass  # stdout gone (closed pipe at shutdown): logging must never kill the worker


class JsonLogger:
    def __init__(self, stream: TextIO | None = None, **context: Any) -> None:
        self._stream = stream
        self._context = context

    def bind(self, **context: Any) -> "JsonLogger":
        """A logger that adds these fields to every event."""
        return JsonLogger(self._stream, **{**self._context, **context})

    def _emit(self, level: str, event: str, fields: dict[str, Any]) -> None:
        _write(self._stream, _line(level, event, {**self._context, **fields}))

    def info(self, event: str, **fields: Any) -> None:
        self._emit("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit("error", event, fields)


# --- the standard logging module, warnings, uncaught exceptions ---------------------------

LIBRARY_EVENT = "log"  # a record that names no event of its own
_EVENTS_BY_LOGGER = {"py.warnings": "python_warning"}
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """A stdlib log record as one line shaped like :class:`JsonLogger`'s: ``ts``,
    ``level``, ``event`` (from ``extra={"event": ...}``, else ``log``), the context
    fields, ``logger``, ``message``, the record's other ``extra`` fields, and
    ``traceback`` when it carries an exception. JSON escapes the newlines of a
    multi-line message or traceback, so a record is always one line."""

    def __init__(self, **context: Any) -> None:
        super().__init__()
        self._context = context

    def format(self, record: logging.LogRecord) -> str:
        extra = {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRIBUTES}
        event = extra.pop("event", None) or _EVENTS_BY_LOGGER.get(record.name, LIBRARY_EVENT)
        fields = {**self._context, "logger": record.name, "message": _message(record), **extra}
        if record.exc_info:
            fields["traceback"] = self.formatException(record.exc_info)
        elif record.exc_text:
            fields["traceback"] = record.exc_text
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        return _line(record.levelname.lower(), event, fields, ts=record.created)


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except (TypeError, ValueError):  # a library's format string and arguments disagree
        return f"{record.msg} {record.args!r}"


class JsonLinesHandler(logging.Handler):
    """Writes each record as a :class:`JsonFormatter` line to ``stream`` (stdout when
    ``None``). Never raises and never prints logging's own multi-line error report."""

    def __init__(self, stream: TextIO | None = None, **context: Any) -> None:
        super().__init__()
        self._stream = stream
        self.setFormatter(JsonFormatter(**context))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception as exc:  # a field that str() cannot render
            line = _line("error", "log_record_unprintable", {"logger": record.name, "detail": repr(exc)})
        _write(self._stream, line)


class XraySamplingUnavailable(logging.Filter):
    """The X-Ray SDK's sampling pollers (2.15.0) log an error with a full botocore
    traceback, over a hundred lines, on every failed poll: rules at once when the first
    segment opens and then every 5 minutes, targets every 10 seconds once rules exist.
    Without a reachable daemon every poll fails, and the SDK carries on with its local
    sampling rules. So the first failure passes as one ``xray_sampling_unavailable``
    warning with the exception in ``detail``; later ones are only counted
    (``suppressed``). Once per process: a daemon that comes and goes is not tracked."""

    LOGGERS = ("aws_xray_sdk.core.sampling.rule_poller", "aws_xray_sdk.core.sampling.target_poller")
    MESSAGE_PREFIX = "Encountered an issue while polling"

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._reported = False
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.name in self.LOGGERS and str(record.msg).startswith(self.MESSAGE_PREFIX)):
            return True
        with self._lock:
            if self._reported:
                self.suppressed += 1
                return False
            self._reported = True
        exc = record.exc_info[1] if record.exc_info else None
        record.event = "xray_sampling_unavailable"
        record.detail = f"{type(exc).__name__}: {exc}" if exc else None
        record.msg = (
            f"{record.msg} Sampling rules come through the X-Ray daemon (AWS_XRAY_DAEMON_ADDRESS); until it"
            " answers, local sampling rules apply. Reported once: later failed polls are not logged."
        )
        record.args = None
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True

    def install(self) -> None:
        for name in self.LOGGERS:
            logger = logging.getLogger(name)
            if self not in logger.filters:
                logger.addFilter(self)


xray_sampling_unavailable = XraySamplingUnavailable()
_uncaught = logging.getLogger("wsfleet.uncaught")


def route_stdlib_logging(*, stream: TextIO | None = None, level: int = logging.WARNING, **context: Any) -> None:
    """Call first thing in a process's entry point. From then on these each become one
    JSON line on stdout (or ``stream``), with ``context`` as extra fields:

    * every record of the standard ``logging`` module at ``level`` or above (the
      default keeps out libraries' per-request info lines);
    * warnings (``python_warning``);
    * exceptions nothing caught, in the main thread or another (``uncaught_exception``)
      or only reportable as ignored, e.g. in ``__del__`` (``unraisable_exception``). The
      asyncio loop's default exception handler logs to the ``asyncio`` logger, so a
      task's exception nobody retrieved arrives as a record like any other;
    * the X-Ray sampling poller's failure, once (:class:`XraySamplingUnavailable`).

    It replaces the root logger's handlers, as ``logging.basicConfig(force=True)`` does
    (in Lambda, the runtime's plain-text one). Calling it again replaces the previous
    set-up, e.g. to add ``worker_id`` once it is known.
    """
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(JsonLinesHandler(stream, **context))
    root.setLevel(level)
    logging.captureWarnings(True)
    xray_sampling_unavailable.install()
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread
    sys.unraisablehook = _log_unraisable


def _log_uncaught(exc_type: Any, exc: Any, tb: Any) -> None:
    _uncaught.critical(
        "An exception nothing caught ended the program.",
        exc_info=(exc_type, exc, tb),
        extra={"event": "uncaught_exception"},
    )


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:  # as the default hook: a thread may end itself so
        return
    thread = args.thread.name if args.thread is not None else None
    _uncaught.error(
        f"An exception nothing caught ended thread {thread}.",
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        extra={"event": "uncaught_exception", "thread_name": thread},
    )


def _log_unraisable(unraisable: Any) -> None:
    _uncaught.error(
        f"{unraisable.err_msg or 'Exception ignored in'}: {unraisable.object!r}",
        exc_info=(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback),
        extra={"event": "unraisable_exception"},
    )
