"""The reference consumer of the messages stream (``SINK=kinesis``): a Lambda on a
Kinesis event source mapping that delivers each (connection, seq) to S3 once, however
often the stream delivers it (:mod:`.delivery` decides, :mod:`.state` remembers,
:mod:`.batch` is the handler; :mod:`.local` stands in for the event source mapping on
the embedded default)."""

from .batch import Consumer, handler, object_key
from .delivery import Delivered, decide

__all__ = ["Consumer", "Delivered", "decide", "handler", "object_key"]
