"""TRACING=xray-sdk in the worker: lifecycle segments per asyncio task, AWS calls as
subsegments, trace context continued from a header, trace ids in log lines."""

import asyncio
import io
import json

import pytest
from aws_xray_sdk.core import xray_recorder
from aws_xray_sdk.core.context import Context
from aws_xray_sdk.core.emitters.udp_emitter import UDPEmitter

from wsfleet import tracing
from wsfleet.logs import JsonLogger

HEADER = "Root=1-6565e1a0-0123456789abcdef01234567;Parent=1111111111111111;Sampled=1"


class CapturingEmitter:
    """Stands in for the UDP link to the X-Ray daemon; keeps what would be sent."""

    def __init__(self):
        self.sent = []

    def send_entity(self, entity):
        self.sent.append(json.loads(entity.serialize()))

    def set_daemon_address(self, address):
        pass


@pytest.fixture
def emitter():
    capture = CapturingEmitter()
    tracing.reset()
    yield capture
    tracing.reset()
    xray_recorder.configure(context=Context(), emitter=UDPEmitter(), sampling=True)


def configure(emitter):
    tracing.configure_worker("xray-sdk", "wsfleet-test")
    xray_recorder.configure(emitter=emitter, sampling=False)


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
        configure(emitter)
        await asyncio.gather(acquire("a"), acquire("b"))

    asyncio.run(main())
    segments = [s for s in emitter.sent if s["name"] == "acquire"]
    assert sorted(s["annotations"]["connection_id"] for s in segments) == ["a", "b"]
    assert all([sub["name"] for sub in s["subsegments"]] == ["ConnectionsStore.acquire"] for s in segments)


def test_a_segment_continues_its_parents_trace_and_a_nested_one_keeps_the_outer(emitter):
    out = io.StringIO()

    async def main():
        configure(emitter)
        with tracing.segment("end_session", session="dead#1") as outer:
            with tracing.segment("drain", parent=outer.header, session="dead#1") as drain:
                assert tracing.current_header() == drain.header
                JsonLogger(out).info("inside")
            with tracing.subsegment("SessionsStore.end_expired"):  # still the outer's
                pass
        with tracing.segment("acquire", parent=HEADER, fence=2):
            pass

    asyncio.run(main())
    by_name = {s["name"]: s for s in emitter.sent}
    end, drain, acquire = by_name["end_session"], by_name["drain"], by_name["acquire"]
    assert drain["trace_id"] == end["trace_id"] and drain["parent_id"] == end["id"]
    assert [s["name"] for s in end["subsegments"]] == ["SessionsStore.end_expired"]
    assert (acquire["trace_id"], acquire["parent_id"]) == ("1-6565e1a0-0123456789abcdef01234567", "1111111111111111")
    assert acquire["annotations"] == {"fence": 2}
    assert json.loads(out.getvalue())["trace_id"] == end["trace_id"]


def test_without_configuration_segments_are_silent_no_ops():
    tracing.reset()
    with tracing.segment("acquire", connection_id="a") as span:
        with tracing.subsegment("ConnectionsStore.acquire") as inner:
            span.annotate(outcome="acquired")
            assert not span.recording and not inner.recording
            assert span.header is None and tracing.current_header() is None and tracing.trace_id() is None


def test_a_failed_blocks_message_is_not_in_its_segment_only_its_type(emitter):
    secret = "wss://up.example/feed?token=s3cr3t"

    async def main():
        configure(emitter)
        with pytest.raises(ValueError, match="s3cr3t"):
            with tracing.segment("connect", connection_id="c1"):
                with tracing.subsegment("secrets.get"):
                    raise ValueError(f"bad URI {secret}")

    asyncio.run(main())
    text = json.dumps(emitter.sent)
    assert "s3cr3t" not in text
    connect = next(s for s in emitter.sent if s["name"] == "connect")
    assert connect["fault"] and connect["cause"]["exceptions"][0]["type"] == "ValueError"
