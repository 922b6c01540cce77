"""X-Ray in the worker: lifecycle segments per asyncio task, AWS calls as subsegments."""

import asyncio
import json

import pytest
from aws_xray_sdk.core import xray_recorder
from aws_xray_sdk.core.context import Context
from aws_xray_sdk.core.emitters.udp_emitter import UDPEmitter

from wsfleet import tracing


class CapturingEmitter:
    """Stands in for the UDP link to the X-Ray daemon; keeps what would be sent."""

    def __init__(self):
        self.sent = []

    def send_entity(self, entity):
        self.sent.append(json.loads(entity.serialize()))

    def set_daemon_address(self, address):
        pass


@pytest.fixture
def emitter(monkeypatch):
    capture = CapturingEmitter()
    monkeypatch.setattr(tracing, "_configured", False)
    yield capture
    xray_recorder.configure(context=Context(), emitter=UDPEmitter(), sampling=True)


def test_each_task_traces_its_own_segment_with_its_calls_as_subsegments(emitter):
    async def call():
        with tracing.subsegment("ConnectionsStore.acquire"):
            await asyncio.sleep(0.01)

    async def acquire(cid):
        with tracing.segment("acquire", connection_id=cid):
            # As the worker does: the call runs under wait_for, in a task of its own on
            # some Python versions, and named tasks are created meanwhile.
            side = asyncio.create_task(asyncio.sleep(0), name=f"side:{cid}")
            await asyncio.wait_for(call(), timeout=5)
            await side

    async def main():
        tracing.configure_worker("wsfleet-test")
        xray_recorder.configure(emitter=emitter, sampling=False)
        await asyncio.gather(acquire("a"), acquire("b"))

    asyncio.run(main())
    segments = [s for s in emitter.sent if s["name"] == "acquire"]
    assert sorted(s["annotations"]["connection_id"] for s in segments) == ["a", "b"]
    assert all([sub["name"] for sub in s["subsegments"]] == ["ConnectionsStore.acquire"] for s in segments)


def test_without_worker_configuration_segments_are_silent_no_ops():
    with tracing.segment("acquire", connection_id="a") as span:
        assert not span.recording


def test_where_the_variable_switches_x_ray_off_no_call_reaches_for_the_sdk(monkeypatch):
    # As in a process started with AWS_XRAY_SDK_ENABLED=false (the local fleet's
    # workers): the SDK was never imported, so none of its names exist here.
    monkeypatch.setattr(tracing, "ENABLED", False)
    for name in ("xray_recorder", "global_sdk_config", "patch", "LambdaContext"):
        monkeypatch.delattr(tracing, name)
    monkeypatch.setattr(tracing, "_configured", False)

    tracing.configure("wsfleet-test")
    tracing.configure_worker("wsfleet-test")
    assert not tracing.in_lambda()
    with tracing.segment("acquire", connection_id="a") as span:
        span.annotate(outcome="acquired")
        with tracing.subsegment("ConnectionsStore.acquire") as inner:
            assert not span.recording and not inner.recording
