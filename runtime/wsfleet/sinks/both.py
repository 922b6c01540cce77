"""``SINK=dynamodb,kinesis``: the table and the stream behind one :class:`~.sink.Sink`."""

from __future__ import annotations

from typing import Mapping, Sequence

from ..stream import Frame
from .objects import StoredObject
from .sink import Sink


class BothSinks:
    """``SINK=dynamodb,kinesis``: each call stored in the table, then on the stream, and
    acknowledged only once both have it (a retry of the whole call rewrites the table's
    keys and delivers the stream's records again, same fence). A new owner resumes from
    the checkpoint, as for a stream alone: the table's tail is not read, since the
    stream has no tail to match it with (the table rewrites the same keys).

    Its batch is the table's (25): the table splits bigger ones in BatchWriteItems sent
    one after the other, which would cost the writer its concurrent batches."""

    reads_tail = False

    def __init__(self, table: Sink, stream: Sink) -> None:
        self.table = table
        self.stream = stream
        self.names = (*table.names, *stream.names)
        self.max_batch = min(table.max_batch, stream.max_batch)

    def put_many(
        self,
        entries: Sequence[tuple[str, int, Frame]],
        *,
        worker_id: str,
        objects: Mapping[tuple[str, int], StoredObject] | None = None,
    ) -> None:
        self.table.put_many(entries, worker_id=worker_id, objects=objects)
        self.stream.put_many(entries, worker_id=worker_id, objects=objects)

    def stored_end(self, connection_id: str, checkpoint: int) -> int:
        return checkpoint
