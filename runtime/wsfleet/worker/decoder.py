"""Large frames parsed off the event loop, within a memory budget.

``json.loads`` of a frame of many small values holds the GIL while it builds millions of
objects: a thread does not help. One 32 MiB frame ``{"seq":1,"data":[{},{},...]}``, on
the loop, held it about 3 s and cost 856 MB (sessions missed renewals, neighbours
stalled, the task ran out of memory, and again at every takeover). So a frame over
``OFF_LOOP_BYTES`` is parsed in a child process (:mod:`.decode_child`: the same
:func:`~wsfleet.stream.parse_frame`, so it becomes exactly what it would have on the
loop) whose address space may grow by at most ``DECODE_FACTOR`` times the largest frame
beyond that frame. A frame that needs more, or longer than ``DECODE_TIMEOUT_S``, or that the
child dies on, is given up as a skip marker at its seq (``Problem.OVER_DECODE_BUDGET``,
stored ``over_frame_limit``); the connection stays up, as for any bad frame.

One child per worker, started on the first large frame (``forkserver``: never a fork of
this threaded asyncio process), one frame at a time, first come first served; a child
that died or was killed is replaced on the next frame. A connection's receive loop
awaits its frame, so its later frames wait behind it, in order; other connections'
small frames never wait, their large ones queue for the child. Pipe I/O happens in one
thread of its own, so the loop only hands the frame over and takes the result back.
"""

from __future__ import annotations

import asyncio
import codecs
import multiprocessing
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Protocol

from ..budget import DECODE_FACTOR
from ..logs import JsonLogger
from ..stream import Frame, FrameShape, Problem, Rejected, SeqTracker, unparsed
from . import decode_child
from .frames import Received, decided, receive

# Frames up to this size are parsed on the loop (the fast path: no copy, no hop). The
# costliest shape (``[{},{},...]``) took 67 ms for 512 KiB and 160 ms for 1 MiB on a busy
# 2-core machine, against a 100 ms bound on holding the loop: a quarter of a MiB leaves
# room. Ordinary frames are far smaller; data this large goes to S3 anyway.
OFF_LOOP_BYTES = 256 * 1024
# A parse that takes longer is given up (its child killed): a frame at the limit within
# the budget parses in 1-3 s; this leaves a busy machine ample margin.
DECODE_TIMEOUT_S = 20.0
# The child's answer is decoded from UTF-8 in pieces of this size (see _decoded).
DECODE_PIECE_BYTES = 1 << 20


class LoopMeter(Protocol):
    """What the loop time of a frame parsed on the loop is charged to: its socket."""

    def charge_loop(self, seconds: float) -> None: ...


@dataclass
class DecoderStats:
    frames: int = 0  # parsed in the child
    given_up: int = 0  # made a skip marker: over the memory budget, the time limit, or the child died
    timeouts: int = 0
    children_started: int = 0
    longest_ms: float = 0.0  # the longest wait for one frame (the frame's connection waits that long)


class FrameDecoder:
    """The worker's frame parser: small frames on the loop, large ones in the child.
    ``off_loop_bytes`` None: every frame on the loop (:data:`IN_LOOP`, nothing started)."""

    def __init__(
        self,
        *,
        max_frame_bytes: int,
        off_loop_bytes: int | None = OFF_LOOP_BYTES,
        timeout_s: float = DECODE_TIMEOUT_S,
        log: JsonLogger | None = None,
    ) -> None:
        self.off_loop_bytes = off_loop_bytes
        self.budget_bytes = DECODE_FACTOR * max_frame_bytes  # what the default budget leaves aside (wsfleet.budget)
        self.timeout_s = timeout_s
        self.stats = DecoderStats()
        self._log = log or JsonLogger()
        self._lock = asyncio.Lock()
        self._thread: ThreadPoolExecutor | None = None  # the pipe's one thread, started with the first child
        self._child: _Child | None = None  # touched by that thread only, but for kill() and close()

    async def receive(
        self,
        message: bytes,
        received_at_ms: int,
        tracker: SeqTracker,
        shape: FrameShape,
        *,
        may_start_fresh: bool,
        meter: LoopMeter | None = None,
    ) -> Received:
        """:func:`.frames.receive`, with a frame over ``off_loop_bytes`` parsed in the child;
        the loop time a frame parsed here takes is charged to ``meter`` (its socket's share
        of the loop, :mod:`.socket_budget`)."""
        if self.off_loop_bytes is None or len(message) <= self.off_loop_bytes:
            began = time.perf_counter()
            got = receive(message, received_at_ms, tracker=tracker, shape=shape, may_start_fresh=may_start_fresh)
            if meter is not None:
                meter.charge_loop(time.perf_counter() - began)
            return got
        parsed = await self.parse(message, received_at_ms, shape)
        return decided(parsed, len(message), tracker=tracker, may_start_fresh=may_start_fresh)

    async def parse(self, message: bytes, received_at_ms: int, shape: FrameShape) -> Frame | Rejected:
        """:func:`~wsfleet.stream.parse_frame` in the child, within its budget and
        ``timeout_s``; never raises but cancellation (which kills a child busy with this
        frame: it would otherwise answer the next one with this one's result)."""
        async with self._lock:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="decoder")
            began = time.monotonic()
            ticket = _Ticket()
            loop = asyncio.get_running_loop()
            exchange = loop.run_in_executor(self._thread, self._exchange, ticket, message, received_at_ms, shape)
            try:
                parsed = await asyncio.wait_for(exchange, self.timeout_s)
            except TimeoutError:
                self.stats.timeouts += 1
                self._log.warning("decode_timed_out", size=len(message), timeout_s=self.timeout_s)
                parsed = None
            except (EOFError, OSError) as exc:  # the child died on this frame (killed, beyond its cap), or did not start
                self._log.warning("decoder_child_lost", size=len(message), error=f"{type(exc).__name__}: {exc}")
                parsed = None
            except BaseException:
                ticket.abandoned = True
                self.kill()
                raise
            finally:
                self.stats.longest_ms = max(self.stats.longest_ms, (time.monotonic() - began) * 1000)
            if parsed is None:
                ticket.abandoned = True  # (its thread may not have begun: it must not begin now)
                self.kill()  # (a timed-out child is still at it: its answer must never be read)
                self.stats.given_up += 1
                return unparsed(message, Problem.OVER_DECODE_BUDGET, received_at_ms, shape)
            self.stats.frames += 1
            if parsed.problem is Problem.OVER_DECODE_BUDGET:
                self.stats.given_up += 1
            return parsed

    def _exchange(self, ticket: _Ticket, message: bytes, received_at_ms: int, shape: FrameShape) -> Frame | Rejected:
        """In the pipe's thread: one frame to the child and its answer back. A child that
        died before it had the frame (while idle: no fault of this frame) is replaced and
        the frame sent again, once; one that dies after raises (EOFError, OSError)."""
        for attempt in (1, 2):
            child = self._child
            if child is None or not child.process.is_alive():
                self._drop(child)
                child = self._child = _Child(self.budget_bytes)
                self.stats.children_started += 1
            if ticket.abandoned:  # (checked once the child is up: starting one can take a while)
                raise EOFError("the frame was given up before it reached the child")
            try:
                child.conn.send((received_at_ms, shape.seq.text, shape.data.text, shape.format, shape.assigned,
                                 tuple((pointer.text, equals) for pointer, equals in shape.ignore)))
                child.conn.send_bytes(message)
                break
            except OSError:
                self._drop(child)
                if attempt == 2:
                    raise
        try:
            answer, has_data = child.conn.recv()
            if not has_data:
                return answer
            data = child.conn.recv_bytes()
        except BaseException:
            self._drop(child)
            raise
        return replace(answer, data_json=_decoded(data))

    def _drop(self, child: _Child | None) -> None:
        if child is not None:
            child.close()
            if self._child is child:
                self._child = None

    def kill(self) -> None:
        """Kill the child, if any: a frame it is parsing fails (the thread sees EOF),
        and the next frame starts a new one."""
        child = self._child
        if child is not None:
            child.process.kill()

    @property
    def child_pid(self) -> int | None:
        child = self._child
        return child.process.pid if child is not None else None

    def close(self) -> None:
        """Stop the child and the thread (the worker is leaving)."""
        self.kill()
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)

    def describe(self) -> dict[str, object]:
        """For the ``stats`` line."""
        return {**vars(self.stats), "child_pid": self.child_pid, "longest_ms": round(self.stats.longest_ms, 1)}


def _decoded(data: bytes) -> str:
    """UTF-8 ``data`` as text, a piece at a time: one call over 32 MiB would hold the GIL,
    and so the event loop, 50-120 ms; pieces of DECODE_PIECE_BYTES take about 1 ms each
    (the join at the end, a copy, about 20-70 ms)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    return "".join([decoder.decode(view[i : i + DECODE_PIECE_BYTES]) for i in range(0, len(view), DECODE_PIECE_BYTES)])


class _Ticket:
    """One frame's exchange; abandoned once the loop gave the frame up (timed out,
    cancelled): a thread that has not sent it yet must not."""

    abandoned = False


class _Child:
    """The child process and the worker's end of its pipe."""

    def __init__(self, budget_bytes: int) -> None:
        context = multiprocessing.get_context("forkserver")
        self.conn, theirs = context.Pipe()
        self.process = context.Process(
            target=decode_child.serve, args=(theirs, budget_bytes), name="wsfleet-decoder", daemon=True
        )
        self.process.start()
        theirs.close()  # ours is the only end left here: the child's death reads as EOF

    def close(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


# Every frame on the loop: what a runner uses unless the worker gives it its decoder.
IN_LOOP = FrameDecoder(max_frame_bytes=0, off_loop_bytes=None)
