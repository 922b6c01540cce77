"""The interface the worker's writer stores frames through: a sink (``SINK``,
CONTRACT.md section 4), and the one failure every sink names, :class:`InvalidItem`.

Two kinds, with the same ownership guarantees (the send-time deadline check, a
connection's frames in seq order, the checkpoint only over a gap-free prefix of what the
sink acknowledged):

* the messages table (:class:`wsfleet.sinks.messages.MessagesStore`): one item per
  (connection, seq), a replay rewrites the same key; a new owner reads past the
  checkpoint where the last owner's items end (``stored_end``), so nothing is stored twice;
* a Kinesis stream (:mod:`wsfleet.sinks.kinesis`): one record per frame, a connection's
  records of one call packed into one aggregated Kinesis record; a stream's tail cannot
  be read cheaply, so a new owner resumes from the checkpoint and what was stored
  since it is delivered again (at least once, with a higher fence).

With both (:mod:`wsfleet.sinks.both`), frames go to each, and the new owner resumes as a
stream's does.
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

from ..stream import Frame
from .objects import StoredObject


class InvalidItem(Exception):
    """The sink refuses the entries themselves (DynamoDB's or Kinesis' ValidationException,
    or a value the client cannot serialise, such as a number beyond 38 digits): sent
    again, they fail again. Neither transient nor a lost race: the caller splits the
    batch to find the entry, and stores a skip marker in its place."""


class Sink(Protocol):
    # The names of schema.SINKS it writes to (("dynamodb",), ("kinesis",), ("firehose",) or several).
    names: tuple[str, ...]
    # Entries the writer puts in one put_many call (the sink may split it in requests).
    max_batch: int
    # Whether stored_end reads what is stored past a checkpoint; False: it returns the
    # checkpoint, and a takeover delivers again what was stored since.
    reads_tail: bool

    def put_many(self, entries: Sequence[tuple[str, int, Frame]], *, worker_id: str,
                 objects: Mapping[tuple[str, int], StoredObject] | None = None) -> None:
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
