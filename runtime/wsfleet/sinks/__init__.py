"""Where frames go (``SINK``): one module per sink behind one small interface.

:mod:`.sink` is the interface (:class:`Sink`, and :class:`InvalidItem`, the entries a
sink refuses as such); :mod:`.messages` the messages table, :mod:`.kinesis` the messages
stream, :mod:`.firehose` the delivery stream into S3, :mod:`.both` several together;
:mod:`.objects` the messages bucket, where data
too large for an item or a record is stored first. :mod:`.build` makes the worker's sink
from its configuration (imported from there: it needs the worker's config and clients,
which the router does not). A transient fault is raised as
:class:`wsfleet.store.TransientError`, as the lease tables raise it.
"""

from .both import ManySinks
from .firehose import DeliverySink
from .kinesis import StreamSink
from .messages import MAX_BATCH, MessagesStore
from .objects import CorruptObject, ObjectsStore, StoredObject, data_size, needs_object
from .sink import InvalidItem, Sink

__all__ = [
    "MAX_BATCH",
    "CorruptObject",
    "DeliverySink",
    "InvalidItem",
    "ManySinks",
    "MessagesStore",
    "ObjectsStore",
    "Sink",
    "StoredObject",
    "StreamSink",
    "data_size",
    "needs_object",
]
