"""The worker's X-Ray context (one trace stack per asyncio task)."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from aws_xray_sdk import global_sdk_config
from aws_xray_sdk.core.context import Context
from aws_xray_sdk.core.models.dummy_entities import DummySegment

_entities: ContextVar[tuple[Any, ...]] = ContextVar("wsfleet_xray_entities", default=())


def entities() -> tuple[Any, ...]:
    """This task's open segment and subsegments, innermost last."""
    return _entities.get()


def set_entities(stack: tuple[Any, ...]) -> None:
    _entities.set(stack)


class TaskContext(Context):
    """Trace entities per asyncio task, in a context variable.

    A task starts with a snapshot of its creator's variables, and the stack is an
    immutable tuple, so a task never changes another task's stack. (The SDK's own
    AsyncContext installs a task factory with the pre-3.13 signature, which breaks
    ``create_task(..., name=...)`` on Python 3.13 and later.) Threads start empty, so
    a boto3 call in the worker's pool records nothing by itself.
    """

    def put_segment(self, segment: Any) -> None:
        _entities.set((segment,))

    def put_subsegment(self, subsegment: Any) -> None:
        entity = self.get_trace_entity()
        if not entity or isinstance(entity, DummySegment):
            return
        entity.add_subsegment(subsegment)
        _entities.set(_entities.get() + (subsegment,))

    def end_subsegment(self, end_time: float | None = None) -> bool:
        entity = self.get_trace_entity()
        if not self._is_subsegment(entity):
            return False
        entity.close(end_time)
        _entities.set(_entities.get()[:-1])
        return True

    def get_trace_entity(self) -> Any:
        entities = _entities.get()
        if entities:
            return entities[-1]
        if not global_sdk_config.sdk_enabled():
            return DummySegment()
        return self.handle_context_missing()

    def set_trace_entity(self, trace_entity: Any) -> None:
        _entities.set((trace_entity,))

    def clear_trace_entities(self) -> None:
        _entities.set(())
