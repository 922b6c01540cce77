"""The worker's memory budget for frame data: how many bytes of frames it may hold at once.

Frames are held in two places, each bounded by its share of one budget
(``MAX_BUFFERED_BYTES``):

* the sockets (:mod:`wsfleet.worker.gate`): a socket may hold up to ``allowance`` bytes
  (its partial frame, frames queued for the receive loop, the message the loop is
  handing on) without asking; beyond that it needs one of ``receive_slots`` slots, each
  sized for a frame at the limit, and waits with its reading paused until one is free;
* the writer (:mod:`wsfleet.worker.writer`): data handed over and not yet stored, up to
  ``writer_bytes`` (one frame is always taken when it holds nothing, so a frame larger
  than its share cannot wedge it).

A slot is costed at ``SLOT_FRAMES`` frames at the limit: while a frame arrives,
websockets keeps the partial frame and, at its end, a copy of it; while the receive loop
hands a message on, it holds the message and its parsed data. Parsing itself (one frame
at a time: it runs on the event loop) and the Python process are outside the budget,
which is why the default leaves half of the task's memory to them, after setting aside
what the frame decoder's child process may use (:func:`decoder_reserve_bytes`).

Pure arithmetic and one read of the cgroup file; no asyncio, no websockets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")  # cgroup v2: the task's (container's) memory limit
DEFAULT_SHARE = 0.5  # of the task's memory, when it is known
FALLBACK_BYTES = 256 * 1024 * 1024  # when it is not (no cgroup v2 limit: a laptop, the embedded default)
ALLOWANCE_BYTES = 64 * 1024  # what a socket holds without a slot: every ordinary frame
SLOT_FRAMES = 2  # frames at the limit a slot is costed at (see the module docstring)
RECEIVE_SHARE = 0.5  # of the budget, for the sockets' slots; the rest is the writer's
# While the decoder's child parses a frame, its address space may grow, beyond what it maps
# with the frame in hand, by this many times the largest frame, whatever frame it parses:
# a task's memory is then the worker's plus a known bound (160 MiB at the default 32 MiB
# limit), which the default budget leaves aside. Five covers JSON text of any shape short
# of the tiny-values ones: ASCII peaks at 3x its size, text beyond Latin-1 (two bytes a
# character in Python) at 7x (a 20 MiB frame: 140 MiB), a list of small numbers at 7x
# (30 MiB of [0,0,...]: 206 MiB, given up), a list of empty objects at 24x: what an
# amplifying frame is made of.
DECODE_FACTOR = 5
DECODER_BASE_BYTES = 32 * 1024 * 1024  # the decoder child's interpreter and what it imports


def task_memory_bytes(path: Path = CGROUP_MEMORY_MAX) -> int | None:
    """The memory limit of the cgroup this process runs in (ECS sets it from the task
    definition), or None when there is none ("max") or it cannot be read."""
    try:
        raw = path.read_text().strip()
    except OSError:
        return None
    if not raw.isdigit():
        return None
    return int(raw) or None


def decoder_reserve_bytes(max_frame_bytes: int) -> int:
    """What the worker's frame decoder (:mod:`wsfleet.worker.decoder`) may hold at most:
    its interpreter, the largest frame, and what parsing it may grow by."""
    return DECODER_BASE_BYTES + (1 + DECODE_FACTOR) * max_frame_bytes


def default_budget_bytes(task_memory: int | None, max_frame_bytes: int) -> int:
    """``MAX_BUFFERED_BYTES`` when it is not set: half of what the task's memory leaves
    beside the frame decoder (at least one frame), else 256 MiB."""
    if not task_memory:
        return FALLBACK_BYTES
    return max(max_frame_bytes, int((task_memory - decoder_reserve_bytes(max_frame_bytes)) * DEFAULT_SHARE))


@dataclass(frozen=True)
class MemoryBudget:
    """One worker's budget of frame bytes, split between the sockets and the writer."""

    total_bytes: int
    max_frame_bytes: int
    allowance_bytes: int = ALLOWANCE_BYTES

    @property
    def receive_slots(self) -> int:
        """Sockets that may hold a frame larger than the allowance at once (at least one:
        a frame at the limit must always be receivable)."""
        per_slot = SLOT_FRAMES * self.max_frame_bytes
        return max(1, int(self.total_bytes * RECEIVE_SHARE) // per_slot)

    @property
    def writer_bytes(self) -> int:
        """Frame data the writer may hold (handed over, not yet stored)."""
        return max(1, self.total_bytes - int(self.total_bytes * RECEIVE_SHARE))

    def describe(self) -> dict[str, int]:
        """What the start-up log line and the stats line say about it."""
        return {
            "total_bytes": self.total_bytes,
            "max_frame_bytes": self.max_frame_bytes,
            "allowance_bytes": self.allowance_bytes,
            "receive_slots": self.receive_slots,
            "writer_bytes": self.writer_bytes,
        }
