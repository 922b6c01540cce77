"""What the tracing backends (:mod:`._xray`, :mod:`._otel`) and the module choosing one
(:mod:`wsfleet.tracing`) share: the modes and their settings, the span handle a backend
returns, and the count of tracing calls that raised. Below both, so that neither imports
the other.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

XRAY_SDK, OTEL, OFF = "xray-sdk", "otel", "off"
MODES = (XRAY_SDK, OTEL, OFF)
OTLP = "otlp"  # OTLP/HTTP protobuf, the exporter shipped (also by its entry point name)
OTLP_NAMES = (OTLP, "otlp_proto_http")
DEFAULT_OTLP_ENDPOINT = "http://localhost:4318/v1/traces"  # a collector in the task

_log = logging.getLogger("wsfleet.tracing")
_lock = threading.Lock()
_span_failures = 0  # tracing calls that raised (see failed)
_span_failure_logged = False


@dataclass(frozen=True)
class Settings:
    """What :func:`wsfleet.config.tracing_settings` read: ``TRACING``, ``TRACING_FILE``,
    and for otel the exporters ``OTEL_TRACES_EXPORTER`` names and where OTLP goes."""

    mode: str = XRAY_SDK
    file: str = ""  # otel: OTLP JSON lines in this file instead of the exporters
    exporters: tuple[str, ...] = (OTLP,)
    endpoint: str = DEFAULT_OTLP_ENDPOINT


class Span:
    """An open span (segment or subsegment), or nothing; ``annotate`` is always safe."""

    def __init__(self, entity: Any = None, backend: Any = None) -> None:
        self._entity = entity
        self._backend = backend

    @property
    def recording(self) -> bool:
        return self._entity is not None

    def annotate(self, **annotations: str | int | float | bool | None) -> None:
        """Indexed key/values on the span; ``None`` values are skipped."""
        if self._entity is not None:
            try:
                self._backend.annotate(self._entity, {k: v for k, v in annotations.items() if v is not None})
            except Exception as exc:  # noqa: BLE001 - see wsfleet.tracing's docstring
                failed("annotate", exc)

    @property
    def header(self) -> str | None:
        """This span's X-Ray trace header, to parent work elsewhere to it (None: none)."""
        if self._entity is None:
            return None
        try:
            return self._backend.header(self._entity)
        except Exception as exc:  # noqa: BLE001
            failed("header", exc)
            return None


def failed(stage: str, exc: BaseException) -> None:
    """A tracing call that raised: counted, and logged the first time (per
    :func:`wsfleet.tracing.configure`)."""
    global _span_failures, _span_failure_logged
    with _lock:
        _span_failures += 1
        first, _span_failure_logged = not _span_failure_logged, True
    if first:
        _log.warning(
            "Tracing failed; the work went on untraced. Later failures are counted (TraceExportFailures), not logged.",
            extra={"event": "trace_failed", "stage": stage, "detail": f"{type(exc).__name__}: {exc}"[:300]},
        )


def take_failures() -> int:
    """Tracing calls that raised since the last call."""
    global _span_failures
    with _lock:
        taken, _span_failures = _span_failures, 0
    return taken


def reset_failures() -> None:
    global _span_failures, _span_failure_logged
    with _lock:
        _span_failures, _span_failure_logged = 0, False
