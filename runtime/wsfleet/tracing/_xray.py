"""``TRACING=xray-sdk``: the AWS X-Ray SDK (maintenance mode since 2026-02-25, end of
support 2027-02-25). Where no daemon runs and no segment is open, every call does
nothing and logs nothing: a missing segment is silent for the whole process (the SDK's
default logs an error on every traced call). ``AWS_XRAY_SDK_ENABLED=false`` (the local
fleet sets it) makes :mod:`wsfleet.config` choose ``off`` instead, so the SDK is not even
imported (about 0.4 s of CPU per process); ``AWS_XRAY_CONTEXT_MISSING`` and
``AWS_XRAY_DAEMON_ADDRESS`` are read by the SDK itself.

Trace context across processes: a segment opened with a parent header continues that
trace (``begin_segment(traceid=, parent_id=, sampling=)``), so hints and session items
carry it in this mode too.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from aws_xray_sdk import global_sdk_config
from aws_xray_sdk.core import patch, xray_recorder
from aws_xray_sdk.core.lambda_launcher import LambdaContext
from aws_xray_sdk.core.models.dummy_entities import DummySegment, DummySubsegment

from ._base import Span
from ._xray_context import TaskContext, entities, set_entities

xray_recorder.configure(context_missing="IGNORE_ERROR")


def in_lambda() -> bool:
    """The SDK detected the Lambda runtime, which opens a segment per invocation."""
    return isinstance(xray_recorder.context, LambdaContext)


class Backend:
    def __init__(self, service: str, *, worker: bool) -> None:
        """In Lambda, every AWS SDK call is recorded as a subsegment of the invocation;
        elsewhere botocore is left unpatched, because with no segment open each call would
        only log that it has nowhere to record itself. A worker's segments belong to the
        asyncio task that opened them (:class:`TaskContext`)."""
        self._worker = worker
        if worker:
            xray_recorder.configure(service=service, context=TaskContext(context_missing="IGNORE_ERROR"))
        else:
            xray_recorder.configure(service=service, context_missing="IGNORE_ERROR")
            if in_lambda():
                patch(["botocore"])

    @contextmanager
    def span(self, name: str, parent: str | None, attrs: dict[str, Any], root: bool) -> Iterator[Span]:
        if not global_sdk_config.sdk_enabled():
            yield Span()
            return
        if root:
            if not (self._worker and isinstance(xray_recorder.context, TaskContext)):
                yield Span()
                return
            # A segment inside another in the same task (end_session's drain) must not
            # lose the outer one: the task's stack is put back as it was.
            outer, manager = entities(), xray_recorder.in_segment(name, **_parent_kwargs(parent))
        elif self._current() is None:
            yield Span()
            return
        else:
            outer, manager = None, xray_recorder.in_subsegment(name)
        failed: BaseException | None = None
        try:
            with manager as entity:
                try:
                    yield self._opened(entity, attrs)
                except BaseException as exc:  # recorded by type, raised once the entity is closed
                    failed = _by_type(entity, exc)
        finally:
            if outer is not None:  # () is a stack too
                set_entities(outer)
        if failed is not None:
            raise failed

    def _opened(self, entity: Any, attrs: dict[str, Any]) -> Span:
        if entity is None or isinstance(entity, (DummySegment, DummySubsegment)):
            return Span()
        span = Span(entity, self)
        span.annotate(**attrs)
        return span

    def invocation(self, name: str, attrs: dict[str, Any]) -> Any:
        return self.span(name, None, attrs, False)

    @staticmethod
    def annotate(entity: Any, annotations: dict[str, Any]) -> None:
        for key, value in annotations.items():
            entity.put_annotation(key, value)

    @staticmethod
    def header(entity: Any) -> str | None:
        trace_id = getattr(entity, "trace_id", None)
        if not trace_id:
            return None
        return f"Root={trace_id};Parent={entity.id};Sampled={1 if entity.sampled else 0}"

    def _current(self) -> Any:
        """The open entity new subsegments and headers belong to, or None. A task started
        inside a segment (a batch sent for the first of its askers, a shared secret
        fetch, a retry's attempt) keeps that segment in its copy of the stack after it
        ended: that is none (X-Ray refuses a subsegment of an ended segment by raising)."""
        if self._worker:
            stack = entities()
            entity = stack[-1] if stack else None
            return entity if entity is not None and getattr(entity, "in_progress", False) else None
        return xray_recorder.get_trace_entity()  # Lambda's: the invocation's segment

    def current_header(self) -> str | None:
        entity = self._current()
        return self.header(entity) if entity is not None and not isinstance(entity, (DummySegment, DummySubsegment)) else None

    def clear(self) -> None:
        if self._worker:
            set_entities(())

    def trace_id(self) -> str | None:
        entity = self._current()
        return getattr(entity, "trace_id", None) if entity is not None else None

    def flush(self, timeout_s: float) -> bool:
        return True  # every segment is sent (UDP) as it closes

    def shutdown(self) -> None:
        pass

    def take_export_failures(self) -> int:
        return 0  # a segment goes out by UDP: a failure is never seen here


def _parent_kwargs(parent: str | None) -> dict[str, Any]:
    """``begin_segment``'s arguments continuing the trace of a checked header."""
    if not parent:
        return {}
    fields = dict(part.split("=", 1) for part in parent.split(";"))
    sampled = fields.get("Sampled")
    return {
        "traceid": fields["Root"],
        "parent_id": fields["Parent"],
        "sampling": None if sampled is None else int(sampled),
    }


def _by_type(entity: Any, exc: BaseException) -> BaseException:
    """Record the block's exception on its entity by type only, and give it back to be
    raised. The SDK would record its message (and the SDK's own stack): a message can hold
    what a trace must never carry (a URL's query string in websockets' InvalidURI, a
    header value); the log line has the rest."""
    try:
        if entity is not None and not isinstance(entity, (DummySegment, DummySubsegment)):
            entity.add_exception(type(type(exc).__qualname__, (Exception,), {})(), [])
            if not isinstance(exc, Exception):
                entity.fault = False  # a cancellation is not a fault
    except Exception:  # noqa: BLE001 - the work's own exception is what leaves
        pass
    return exc
