"""Large buffers from the kernel and straight back: glibc's ``malloc`` tuned at start-up.

glibc serves a request of at least its *mmap threshold* with a mapping of its own, given
back to the kernel when freed; smaller ones come from its heaps, which return memory
only from their top. The threshold starts at 128 KiB but moves: each time a mapped
block is freed, it rises to that block's size, up to 32 MiB. After the first large frame
the worker's frame-sized buffers (a frame, its text, its data, an upload's body: 1 to 32
MiB each, made and freed by several threads at once) are then carved from the heaps,
which fragment and keep what they once held. Measured on the large-frames benchmark
(8 connections sending 32 MiB frames back to back, one worker with a 256 MiB budget):
a peak RSS of 586-662 MB with the moving threshold, 349-350 MB with it fixed at 1 MiB
(``MALLOC_MMAP_THRESHOLD_``), at the same throughput.

So the worker fixes the threshold (which also stops it moving) at :data:`MMAP_THRESHOLD`
and caps the heaps (arenas) at :data:`ARENAS`, unless the operator set glibc's own
environment variables, which win. Elsewhere (musl, macOS) it does nothing: a stdlib
``ctypes`` call, no dependency.
"""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD = 1 << 20  # a block of 1 MiB or more is a mapping of its own
ARENAS = 2  # malloc's heaps; glibc's default is 8 per core
_M_MMAP_THRESHOLD = -3  # mallopt's parameters (malloc.h)
_M_ARENA_MAX = -8
_ENV = {_M_MMAP_THRESHOLD: "MALLOC_MMAP_THRESHOLD_", _M_ARENA_MAX: "MALLOC_ARENA_MAX"}


def tune(*, mmap_threshold: int = MMAP_THRESHOLD, arenas: int = ARENAS) -> dict[str, object]:
    """Set what the environment does not; returns what was done, for the start-up log line
    (``{"allocator": "not glibc"}`` where there is no ``mallopt``)."""
    mallopt = _mallopt()
    if mallopt is None:
        return {"allocator": "not glibc"}
    done: dict[str, object] = {"allocator": "glibc"}
    for param, value, key in ((_M_MMAP_THRESHOLD, mmap_threshold, "mmap_threshold"), (_M_ARENA_MAX, arenas, "arena_max")):
        if os.environ.get(_ENV[param]):
            done[key] = f"from {_ENV[param]}"
        else:
            done[key] = value if mallopt(param, value) == 1 else "refused"
    return done


def _mallopt():  # type: ignore[no-untyped-def]
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the interpreter's own symbols: libc's, where it is linked
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt
