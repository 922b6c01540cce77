"""What the worker's writer stores frames through: a sink (``SINK``, CONTRACT.md section 4).

Two kinds, with the same ownership guarantees (the send-time deadline check, a
connection's frames in seq order, the checkpoint only over a gap-free prefix of what the
sink acknowledged):

* the messages table (:class:`wsfleet.store.messages.MessagesStore`): one item per
  (connection, seq), a replay rewrites the same key; a new owner reads past the
  checkpoint where the last owner's items end (``stored_end``), so nothing is stored twice;
* a Kinesis stream (:mod:`wsfleet.store.kinesis`): one record per frame; a stream's tail
  cannot be read cheaply, so a new owner resumes from the checkpoint and what was stored
  since it is delivered again (at least once, with a higher fence).

With both, frames go to each, and the new owner resumes as a stream's does.
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

from ..stream import Frame
from .objects import StoredObject


class Sink(Protocol):
    # The names of schema.SINKS it writes to (("dynamodb",), ("kinesis",) or both).
    names: tuple[str, ...]
    # Entries the writer puts in one put_many call (the sink may split it in requests).
    max_batch: int
    # Whether stored_end reads what is stored past a checkpoint; False: it returns the
    # checkpoint, and a takeover delivers again what was stored since.
    reads_tail: bool

    def put_many(
        self,
        entries: Sequence[tuple[str, int, Frame]],
        *,
        worker_id: str,
        objects: Mapping[tuple[str, int], StoredObject] | None = None,
    ) -> None:
        """Store (connection_id, fence_token, frame) entries, of any connections, each
        connection's in seq order; returns once every one is acknowledged. Synchronous
        (the writer runs it in its pool, under the send deadline). Raises
        ``TransientError`` for what a retry of the whole call may cure, ``InvalidItem``
        for entries the sink refuses as such (the writer splits the batch to find it),
        anything else as it is. Sending again what was acknowledged is allowed (a table
        rewrites the key; a stream delivers it twice, same fence)."""
        ...

    def stored_end(self, connection_id: str, checkpoint: int) -> int:
        """Where a new owner resumes: the end of what is stored gap-free from
        ``checkpoint`` (the table), or ``checkpoint`` itself (a stream)."""
        ...


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
