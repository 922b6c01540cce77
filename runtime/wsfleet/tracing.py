"""AWS X-Ray, kept optional: where no daemon runs and no segment is open, every call
here does nothing and logs nothing.

Importing this module makes a missing segment silent for the whole process (the
SDK's default is to log an error on every traced call). ``AWS_XRAY_SDK_ENABLED=false``
and ``AWS_XRAY_CONTEXT_MISSING`` are read by the SDK itself and win over what we set.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Any, Iterator

# The variable wins over whatever the code sets (the SDK reads it first), so where it is
# "false" nothing can ever be recorded, and the SDK is not even imported: that saves about
# 0.4 s of CPU per process, which the local fleet (it sets it) pays once per worker start.
ENABLED = os.environ.get("AWS_XRAY_SDK_ENABLED", "true").lower() != "false"

if ENABLED:
    from aws_xray_sdk import global_sdk_config
    from aws_xray_sdk.core import patch, xray_recorder
    from aws_xray_sdk.core.lambda_launcher import LambdaContext

    from .xray_context import TaskContext

    xray_recorder.configure(context_missing="IGNORE_ERROR")

_lock = threading.Lock()
_configured = False


def in_lambda() -> bool:
    """The SDK detected the Lambda runtime, which opens a segment per invocation."""
    return ENABLED and isinstance(xray_recorder.context, LambdaContext)


def configure(service: str) -> None:
    """Once per process. In Lambda, also record every AWS SDK call as a subsegment of
    the invocation; elsewhere botocore is left unpatched, because with no segment open
    each call would only log that it has nowhere to record itself."""
    global _configured
    if not ENABLED:
        return
    with _lock:
        if _configured:
            return
        xray_recorder.configure(service=service, context_missing="IGNORE_ERROR")
        if in_lambda():
            patch(["botocore"])
        _configured = True


def configure_worker(service: str) -> None:
    """Worker processes: segments then belong to the asyncio task that opened them
    (:class:`TaskContext`), so a thousand connection tasks can each trace their own
    lifecycle. The daemon address comes from ``AWS_XRAY_DAEMON_ADDRESS`` (the sidecar)
    and is read by the SDK itself."""
    global _configured
    if not ENABLED:
        return
    with _lock:
        if _configured:
            return
        xray_recorder.configure(service=service, context=TaskContext(context_missing="IGNORE_ERROR"))
        _configured = True


@contextmanager
def segment(name: str, **annotations: str | int | float | bool | None) -> Iterator[Span]:
    """A segment of its own (a worker's unit of work: acquire, connect, release), or a
    no-op :class:`Span` when the SDK is disabled or not configured for the worker.
    Open and close it in one task, and start no tasks inside it."""
    recording = ENABLED and isinstance(xray_recorder.context, TaskContext)
    with _span("in_segment", name, recording, annotations) as span:
        yield span


class Span:
    """An open segment or subsegment, or nothing; either way ``annotate`` is safe to call."""

    def __init__(self, entity: Any = None) -> None:
        self._entity = entity

    @property
    def recording(self) -> bool:
        return self._entity is not None

    def annotate(self, **annotations: str | int | float | bool | None) -> None:
        """Indexed key/values on the entity; ``None`` values are skipped."""
        if self._entity is None:
            return
        for key, value in annotations.items():
            if value is not None:
                self._entity.put_annotation(key, value)


@contextmanager
def subsegment(name: str, **annotations: str | int | float | bool | None) -> Iterator[Span]:
    """A subsegment of the current segment, or a no-op :class:`Span` when the SDK is
    disabled or no segment is open. An exception escaping the block is recorded on the
    subsegment and re-raised."""
    recording = ENABLED and xray_recorder.get_trace_entity() is not None
    with _span("in_subsegment", name, recording, annotations) as span:
        yield span


@contextmanager
def _span(opener: str, name: str, recording: bool, annotations: dict[str, Any]) -> Iterator[Span]:
    if not (recording and global_sdk_config.sdk_enabled()):  # recording implies ENABLED
        yield Span()
        return
    with getattr(xray_recorder, opener)(name) as entity:
        span = Span(entity)
        span.annotate(**annotations)
        yield span
