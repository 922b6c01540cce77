"""Lambda's Kinesis event source mapping, as far as the reference consumer relies on it,
for the embedded default and the tests: each shard read in order from TRIM_HORIZON,
its records handed to the handler in batches shaped as Lambda's Kinesis events, one
shard's batches one at a time; a partial batch response makes the shard go on from
the record it names (the ``ReportBatchItemFailures`` behaviour)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

Handler = Callable[[dict, Any], Any]


def kinesis_event(
    shard_id: str, entries: Sequence[Mapping[str, Any]], *, stream_arn: str, region: str
) -> dict[str, Any]:
    """The Lambda event of GetRecords' ``Records`` of one shard."""
    return {
        "Records": [
            {
                "kinesis": {
                    "kinesisSchemaVersion": "1.0",
                    "partitionKey": e["PartitionKey"],
                    "sequenceNumber": e["SequenceNumber"],
                    "data": base64.b64encode(e["Data"]).decode("ascii"),
                    "approximateArrivalTimestamp": e["ApproximateArrivalTimestamp"].timestamp(),
                },
                "eventSource": "aws:kinesis",
                "eventVersion": "1.0",
                "eventID": f"{shard_id}:{e['SequenceNumber']}",
                "eventName": "aws:kinesis:record",
                "awsRegion": region,
                "eventSourceARN": stream_arn,
            }
            for e in entries
        ]
    }


@dataclass
class _Shard:
    shard_id: str
    iterator: str | None = None


@dataclass
class Polled:
    """What one round over the shards did."""

    records: int = 0  # records handed to the handler (again, after a failure)
    batches: int = 0
    failures: list[str] = field(default_factory=list)  # the sequence numbers the handler named


class LocalEventSource:
    """Reads ``stream_name`` with ``kinesis`` (a client of the emulator) and invokes
    ``handler(event, None)`` with batches of at most ``batch_size`` records."""

    def __init__(self, kinesis: Any, stream_name: str, handler: Handler, *, batch_size: int = 100) -> None:
        self._kinesis = kinesis
        self._stream = stream_name
        self._handler = handler
        self._batch_size = batch_size
        summary = kinesis.describe_stream_summary(StreamName=stream_name)["StreamDescriptionSummary"]
        self._arn = summary["StreamARN"]
        self._region = kinesis.meta.region_name
        self._shards: dict[str, _Shard] = {}

    def poll(self) -> Polled:
        """One batch from each shard (new shards found on the way)."""
        for shard in self._kinesis.list_shards(StreamName=self._stream)["Shards"]:
            self._shards.setdefault(shard["ShardId"], _Shard(shard["ShardId"]))
        polled = Polled()
        for shard in self._shards.values():
            if shard.iterator is None:
                shard.iterator = self._kinesis.get_shard_iterator(
                    StreamName=self._stream, ShardId=shard.shard_id, ShardIteratorType="TRIM_HORIZON"
                )["ShardIterator"]
            resp = self._kinesis.get_records(ShardIterator=shard.iterator, Limit=self._batch_size)
            entries = resp["Records"]
            if not entries:
                shard.iterator = resp.get("NextShardIterator")
                continue
            event = kinesis_event(shard.shard_id, entries, stream_arn=self._arn, region=self._region)
            # An exception out of the handler (a crash) leaves the shard where it was: the
            # same batch goes again, as Lambda retries a failed invocation.
            answer = self._handler(event, None) or {}
            shard.iterator = resp.get("NextShardIterator")
            polled.records += len(entries)
            polled.batches += 1
            failed = [f.get("itemIdentifier") for f in answer.get("batchItemFailures", [])]
            if failed:
                # As Lambda does: the shard goes on from the lowest sequence number named.
                first = min(failed, key=int)
                polled.failures.append(first)
                shard.iterator = self._kinesis.get_shard_iterator(
                    StreamName=self._stream, ShardId=shard.shard_id,
                    ShardIteratorType="AT_SEQUENCE_NUMBER", StartingSequenceNumber=first,
                )["ShardIterator"]
        return polled

    def drain(self, *, max_polls: int = 1000) -> list[Polled]:
        """Poll until a round finds nothing new; every round's result. Raises
        RuntimeError if the handler still fails after ``max_polls`` rounds."""
        rounds: list[Polled] = []
        while len(rounds) < max_polls:
            polled = self.poll()
            rounds.append(polled)
            if not polled.records:
                return rounds
        raise RuntimeError(f"the stream was not drained in {max_polls} rounds: the handler kept failing")
