"""The decoder's child process (:mod:`.decoder` starts it, feeds it and replaces it):
large frames parsed by :func:`wsfleet.stream.parse_frame`, exactly as the event loop
parses small ones, in an address space capped so that a frame built to amplify
(``[{},{},...]``: 72 bytes of Python objects for every 3 bytes sent) costs a
``MemoryError`` here, never the worker.

It imports only the stream rules and the standard library: it starts small, and its
cap is room for one frame and its parse, not for a copy of the worker.
"""

from __future__ import annotations

import resource
from dataclasses import replace
from multiprocessing.connection import Connection

from ..pointer import Pointer
from ..stream import Frame, FrameShape, Problem, Rejected, parse_frame, unparsed


def serve(conn: Connection, budget_bytes: int | None) -> None:
    """Answer frames until the pipe closes. Each request is ``(received_at_ms,
    seq_pointer, data_pointer, format, assigned)`` (the connection's FrameShape) then the frame's bytes; each answer what :func:`decode`
    makes of it (sent by :func:`_answer`). ``budget_bytes``: how much the address space
    may grow beyond what it maps once the frame is in hand (None: no cap)."""
    while True:
        try:
            received_at_ms, seq_pointer, data_pointer, form, assigned, ignore = conn.recv()
            message = conn.recv_bytes()
        except EOFError:  # the worker closed its end: leave
            return
        if budget_bytes is not None:
            # From what is mapped now, frame included: what earlier frames left mapped
            # (free heap the allocator reuses) and reading this one cost is not its parse's.
            _cap(budget_bytes)
        rules = tuple((Pointer.parse(pointer), equals) for pointer, equals in ignore)
        shape = FrameShape(Pointer.parse(seq_pointer), Pointer.parse(data_pointer), form, assigned, rules)
        answer = decode(message, received_at_ms, shape)
        try:
            data = None if isinstance(answer, Rejected) or answer.data_json is None else answer.data_json.encode("utf-8")
        except MemoryError:  # its UTF-8 as well did not fit: the frame is given up all the same
            answer, data = unparsed(message, Problem.OVER_DECODE_BUDGET, received_at_ms, shape), None
        _answer(conn, answer, data)


def _answer(conn: Connection, answer: Frame | Rejected, data: bytes | None) -> None:
    """The answer without its data, then the data as UTF-8 bytes, if any: sent as they
    are (no pickled copy), and the worker decodes them piece by piece, never holding its
    GIL for a whole frame's text at once."""
    if data is None:
        conn.send((answer, False))
        return
    conn.send((replace(answer, data_json=""), True))
    conn.send_bytes(data)


def decode(message: bytes, received_at_ms: int, shape: FrameShape) -> Frame | Rejected:
    """:func:`parse_frame`, or, when that runs out of memory, the frame given up
    (:func:`wsfleet.stream.unparsed`: a skip marker at the seq a scan of its head finds)."""
    try:
        return parse_frame(message, received_at_ms, shape)
    except MemoryError:
        pass  # left here, the handler frees the parse's objects (its traceback) before the scan
    return unparsed(message, Problem.OVER_DECODE_BUDGET, received_at_ms, shape)


def _cap(budget_bytes: int) -> None:
    """Let the address space grow by at most ``budget_bytes`` from now (the soft limit,
    which the kernel enforces; within a hard limit the container may set). Linux reads
    the mapped size from ``/proc/self/statm``; elsewhere the child runs with no cap."""
    try:
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * resource.getpagesize()
    except OSError:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes if hard == resource.RLIM_INFINITY else min(mapped + budget_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
