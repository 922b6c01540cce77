"""The writer's sink, built from the worker's configuration (``SINK``)."""

from __future__ import annotations

from .. import schema
from ..aws import Aws
from ..config import WorkerConfig
from ..metrics import Counters
from .both import BothSinks
from .kinesis import StreamSink
from .messages import MessagesStore
from .sink import Sink


def build_sink(config: WorkerConfig, aws: Aws, counters: Counters) -> Sink:
    """Where the writer stores frames (``SINK``): the messages table, the messages stream,
    or both. The stream counts its resends and throttled records from pool threads
    (:class:`~wsfleet.sinks.kinesis.StreamSink` serialises its own adds)."""
    table = (
        MessagesStore(aws.dynamodb_writes, config.messages_table_name, ttl_days=config.message_ttl_days)
        if schema.SINK_DYNAMODB in config.sinks
        else None
    )
    stream = StreamSink(aws.kinesis, config.messages_stream_name, count=counters.add) if aws.kinesis is not None else None
    if table is not None and stream is not None:
        return BothSinks(table, stream)
    sink = table or stream
    if sink is None:  # config.sinks is never empty, and Aws makes a Kinesis client for it
        raise ValueError(f"no sink for SINK={','.join(config.sinks)}")
    return sink
