"""Several sinks at once (``SINK=dynamodb,kinesis``, ``kinesis,firehose``, ...) behind
one :class:`~.sink.Sink`."""

from __future__ import annotations

from typing import Mapping, Sequence

from ..stream import Frame
from .objects import StoredObject
from .sink import Sink


class ManySinks:
    """Each call stored in every part, one after the other in ``schema.SINKS`` order,
    and acknowledged only once all have it (a retry of the whole call rewrites the
    table's keys and delivers the streams' records again, same fence). A new owner
    resumes from the checkpoint, as for a stream alone: the table's tail is not read,
    since a stream has no tail to match it with (the table rewrites the same keys).

    Its batch is the smallest part's (the table's 25): the table splits bigger ones in
    BatchWriteItems sent one after the other, which would cost the writer its
    concurrent batches."""

    reads_tail = False

    def __init__(self, *parts: Sink) -> None:
        if len(parts) < 2:
            raise ValueError("ManySinks takes two sinks or more")
        self.parts = parts
        self.names = tuple(n for p in parts for n in p.names)
        self.max_batch = min(p.max_batch for p in parts)

    def put_many(self, entries: Sequence[tuple[str, int, Frame]], *, worker_id: str,
                 objects: Mapping[tuple[str, int], StoredObject] | None = None) -> None:
        for part in self.parts:
            part.put_many(entries, worker_id=worker_id, objects=objects)

    def stored_end(self, connection_id: str, checkpoint: int) -> int:
        return checkpoint
