"""The writer's sink, built from the worker's configuration (``SINK``)."""

from __future__ import annotations

from .. import schema
from ..aws import Aws
from ..config import WorkerConfig
from ..metrics import Counters
from .both import ManySinks
from .firehose import DeliverySink
from .kinesis import StreamSink
from .messages import MessagesStore
from .sink import Sink


def build_sink(config: WorkerConfig, aws: Aws, counters: Counters) -> Sink:
    """Where the writer stores frames (``SINK``): the messages table, the messages stream,
    the delivery stream, or several. The streams count their resends and throttled
    records from pool threads (each serialises its own adds)."""
    parts: list[Sink] = []
    if schema.SINK_DYNAMODB in config.sinks:
        parts.append(MessagesStore(aws.dynamodb_writes, config.messages_table_name, ttl_days=config.message_ttl_days))
    if aws.kinesis is not None:
        parts.append(StreamSink(aws.kinesis, config.messages_stream_name, count=counters.add))
    if aws.firehose is not None:
        parts.append(DeliverySink(aws.firehose, config.messages_delivery_stream_name, count=counters.add))
    if not parts:  # config.sinks is never empty, and Aws makes a client for each stream
        raise ValueError(f"no sink for SINK={','.join(config.sinks)}")
    return parts[0] if len(parts) == 1 else ManySinks(*parts)
