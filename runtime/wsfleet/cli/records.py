"""``wsfleet records``: a connection's frames as the messages stream holds them
(``SINK`` with kinesis), for a fleet whose read API has no table to read. Only the
connection's shards are read (its partition key's hash falls in their range), from a
point in time or the stream's trim horizon, aggregated records unpacked
(:mod:`wsfleet.aggregation`), and the consumer rule is applied: per seq,
the delivery with the highest fence is kept (a takeover's replay, a resend after a
partial failure and a stale owner's late record collapse into one)."""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from .. import aggregation, records, settings_spec, stack_outputs
from .errors import CliError

_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
ALL = "all"


def since_seconds(text: str) -> float | None:
    """``--since``: ``90s``, ``15m``, ``2h``, ``7d``, or ``all`` (None: the trim horizon)."""
    if text == ALL:
        return None
    match = _DURATION.fullmatch(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"must be a duration such as 90s, 15m, 2h or 7d, or {ALL}, got {text!r}")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def stream_of(stream: str | None, outputs: Mapping[str, str] | None, stack_name: str | None, env: Mapping[str, str]) -> str:
    """The stream: ``--stream``, else the stateful stack's output, else MESSAGES_STREAM_NAME."""
    if stream:
        return stream
    if outputs is not None:
        if not outputs.get(stack_outputs.MESSAGES_STREAM_NAME):
            raise CliError(
                f"stack {stack_name} has no {stack_outputs.MESSAGES_STREAM_NAME} output: name the stateful stack "
                "(wsfleet-<env>-stateful) of an environment whose sink has kinesis"
            )
        return outputs[stack_outputs.MESSAGES_STREAM_NAME]
    name = env.get(settings_spec.MESSAGES_STREAM_NAME, "").strip()
    if not name:
        raise CliError(f"{settings_spec.MESSAGES_STREAM_NAME} not set: export the fleet's environment, or pass --stream or --stack")
    return name


def _target(stream: str) -> dict[str, str]:
    return {"StreamARN": stream} if stream.startswith("arn:") else {"StreamName": stream}


def shards_of(kinesis: Any, stream: str, connection_id: str) -> list[str]:
    """The shards (open or closed, oldest first) whose hash key range holds the
    connection's partition key: Kinesis maps a key to the MD5 of it, as a number."""
    key = int(hashlib.md5(connection_id.encode("utf-8")).hexdigest(), 16)  # noqa: S324 - Kinesis' own mapping
    found: list[str] = []
    kwargs: dict[str, Any] = _target(stream)
    while True:
        resp = kinesis.list_shards(**kwargs)
        for shard in resp["Shards"]:
            low, high = (int(shard["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
            if low <= key <= high:
                found.append(shard["ShardId"])
        if not resp.get("NextToken"):
            return sorted(found)
        kwargs = {"NextToken": resp["NextToken"]}


@dataclass
class Reading:
    """What the shards held for the connection: the kept record per seq, and counts."""

    kept: dict[int, records.Record] = field(default_factory=dict)
    records: int = 0  # the connection's records read (user records: an aggregate's each)
    again: int = 0  # deliveries of a seq already kept (same or lower fence) or superseded
    bad: int = 0  # records under its partition key that are not wsfleet records
    shards: int = 0


def read(kinesis: Any, stream: str, connection_id: str, *, since_s: float | None, now: dt.datetime) -> Reading:
    """Every record of the connection from ``since_s`` seconds before ``now`` (None: the
    trim horizon) to the end of each of its shards, the consumer rule applied."""
    reading = Reading()
    for shard_id in shards_of(kinesis, stream, connection_id):
        reading.shards += 1
        start: dict[str, Any] = {"ShardIteratorType": "TRIM_HORIZON"}
        if since_s is not None:
            start = {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": now - dt.timedelta(seconds=since_s)}
        iterator = kinesis.get_shard_iterator(**_target(stream), ShardId=shard_id, **start)["ShardIterator"]
        while iterator:
            resp = kinesis.get_records(ShardIterator=iterator)
            for entry in resp["Records"]:
                if entry["PartitionKey"] == connection_id:
                    _keep(reading, entry["Data"], connection_id)
            iterator = resp.get("NextShardIterator")
            if not resp["Records"] and not resp.get("MillisBehindLatest"):
                break  # at the tip of an open shard (a closed one ends with no iterator)
    return reading


def _keep(reading: Reading, data: bytes, connection_id: str) -> None:
    try:
        inner = aggregation.user_records(data, connection_id)
    except aggregation.BadAggregate:
        reading.bad += 1
        return
    for user in inner:
        if user.partition_key != connection_id:
            reading.bad += 1
        else:
            _keep_one(reading, user.data, connection_id)


def _keep_one(reading: Reading, data: bytes, connection_id: str) -> None:
    try:
        record = records.decode(data)
    except records.BadRecord:
        reading.bad += 1
        return
    if record.connection_id != connection_id:
        reading.bad += 1
        return
    reading.records += 1
    held = reading.kept.get(record.seq)
    if held is not None:
        reading.again += 1
        if records.newer(held, record):
            return
    reading.kept[record.seq] = record


def entry(record: records.Record) -> dict[str, Any]:
    """A kept record as a line of ``--json``: its fields as the contract names them."""
    out: dict[str, Any] = {"seq": record.seq, "fence_token": record.fence_token, "worker_id": record.worker_id,
                           "received_at_ms": record.received_at_ms}
    if record.has_data:
        out["data"] = record.data
    elif record.data_base64 is not None:
        out["data_base64"] = record.data_base64
    elif record.data_ref is not None:
        out.update(data_ref=record.data_ref, data_bytes=record.data_bytes, data_sha256=record.data_sha256)
    else:
        out["skipped"] = record.skipped
        if record.skip_to is not None:
            out["to_seq"] = record.skip_to
        if record.data_bytes is not None:
            out["data_bytes"] = record.data_bytes
    return out
