"""How a connection logs what its frames meet: bad frames, skip markers, errors of ours.

A noisy upstream must not flood the log: each class is logged at most once per
``FRAME_LOG_EVERY_S`` per connection, and the line says how many of that class were held
back since (``suppressed``). Every one is still counted in its metric by the caller.
"""

from __future__ import annotations

import traceback

from .. import clock
from ..logs import JsonLogger
from ..stream import Frame, Problem
from .supervision import LogSampler

FRAME_LOG_EVERY_S = 60.0  # a connection logs each class of bad frame at most this often
UNEXPECTED = "unexpected"  # the log class of an error of ours while handling a frame


class FrameLog:
    def __init__(self, log: JsonLogger) -> None:
        self._log = log
        self._sampler = LogSampler(FRAME_LOG_EVERY_S)

    def problem(self, problem: Problem | str, *, exc: BaseException | None = None, **fields: object) -> None:
        """A bad frame (``malformed_frame``), or an error of ours while handling one
        (``frame_error``, with its traceback)."""
        name = problem.value if isinstance(problem, Problem) else problem
        suppressed = self._sampler.take(name, clock.now())
        if suppressed is None:
            return
        if exc is not None:
            fields["traceback"] = "".join(traceback.format_exception(exc))
        level = self._log.error if exc is not None else self._log.warning
        level("malformed_frame" if exc is None else "frame_error", problem=name, suppressed=suppressed, **fields)

    def skip(self, marker: Frame, **fields: object) -> None:
        """A marker the stream makes (a gap, a frame over the limit): ``skip_marker`` with
        its reason and the seqs it stands for."""
        suppressed = self._sampler.take(marker.reason, clock.now())
        if suppressed is not None:
            self._log.warning(
                "skip_marker", reason=marker.reason, seq=marker.seq, skip_to=marker.end, suppressed=suppressed, **fields
            )
