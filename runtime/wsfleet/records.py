"""The Kinesis sink's record (CONTRACT.md section 4): one per frame, written by the worker
(:mod:`wsfleet.sinks.kinesis`, which packs a connection's records of one flush into one
aggregated Kinesis record: :mod:`wsfleet.aggregation`), read by the reference consumer
and the local audits.

A record is the UTF-8 JSON object ``{"connection_id", "seq", "fence_token", "worker_id",
"received_at_ms", ...}`` with exactly one of:

* ``"data"``: the frame's data, as the compact JSON the messages table would have held
  in ``message_data`` (embedded as JSON, not as a string of it);
* ``"data_base64"``: a binary feed's frame, its bytes in base64;
* ``"data_ref"``, ``"data_bytes"``, ``"data_sha256"``: data too large for a record,
  stored in the messages bucket first (as for an item: :mod:`wsfleet.sinks.objects`),
  with ``"data_format": "binary"`` for a binary feed's (the object holds the base64
  as a JSON string);
* ``"skipped"`` (a reason of ``schema.SKIPPED_REASONS``), with ``"data_bytes"`` where
  known and ``"skip_to"`` for a range: a skip marker.

Its partition key is the connection id, so one connection's records stay in one shard,
in the order they were accepted. Delivery is at least once: a takeover may deliver the
frames since the last checkpoint again with a higher fence, and a partly refused
PutRecords sends some again with the same fence. The consumer's rule: keep the highest
fence per (connection, seq) (:func:`newer`).

Encoding builds the text directly around the frame's already-encoded data: no second
``json.dumps`` of the data per frame (the ingestion benchmark's CPU per message).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

from . import schema
from .stream import Frame

# Field names: the table's attribute names where the table has the same thing.
CONNECTION_ID = "connection_id"
SEQ = "seq"
FENCE_TOKEN = schema.MSG_FENCE_TOKEN
WORKER_ID = schema.MSG_WORKER_ID
RECEIVED_AT_MS = schema.RECEIVED_AT_MS
DATA = "data"
DATA_BASE64 = "data_base64"
DATA_FORMAT = schema.DATA_FORMAT
DATA_REF = schema.DATA_REF
DATA_BYTES = schema.DATA_BYTES
DATA_SHA256 = schema.DATA_SHA256
SKIPPED = schema.SKIPPED
SKIP_TO = schema.SKIP_TO

# Kinesis' limits: a record's data plus its partition key at most 1 MiB; a PutRecords
# request at most 500 records and 5 MiB (data and partition keys).
MAX_RECORD_BYTES = 1024 * 1024
MAX_PUT_RECORDS = 500
# The delivery stream (SINK=firehose): a record at most 1,000 KiB (before base64), a
# PutRecordBatch at most 500 records and 4 MiB; each line carries the partition its
# connection is filed under (connection_bucket): 64 keep a day's partitions few (the
# delivery stream's default quota is 500 active partitions) while a query for one
# connection reads a 64th of a day.
FIREHOSE_MAX_RECORD_BYTES = 1000 * 1024
FIREHOSE_MAX_PUT_RECORDS = 500
FIREHOSE_MAX_PUT_BYTES = 4 * 1024 * 1024
CONNECTION_BUCKETS = 64
# The delivery stream's buffer: S3 objects cut per active partition every this many
# seconds or MiB, whichever first (dynamic partitioning needs 64 MiB at least; 5 minutes
# keeps a quiet fleet's frames at most that late in S3, its objects one per partition each).
FIREHOSE_BUFFER_SECONDS = 300
FIREHOSE_BUFFER_MIB = 128
CONNECTION_BUCKET = "connection_bucket"


def connection_bucket(connection_id: str) -> int:
    """The partition a connection's lines are filed under: CRC-32 of its UTF-8 id modulo
    64 (Athena computes the same: ``crc32(to_utf8(connection_id)) % 64``)."""
    return zlib.crc32(connection_id.encode("utf-8")) % CONNECTION_BUCKETS
MAX_PUT_BYTES = 5 * 1024 * 1024
MAX_PARTITION_KEY_CHARS = 256
# An aggregate's most bytes (data and partition key; :mod:`wsfleet.aggregation`): the
# record limit less headroom.
MAX_AGGREGATE_BYTES = MAX_RECORD_BYTES - 64 * 1024


def encode(connection_id: str, fence_token: int, worker_id: str, frame: Frame, *, data_ref: tuple[str, int, str] | None = None) -> bytes:
    """The record of one frame. ``data_ref``: (ref, size, sha256 hex) of its data's
    object, for data stored in the bucket (the caller decides which: see
    ``sinks.objects.needs_object``); then the data itself is not in the record."""
    head = (
        f'{{"{CONNECTION_ID}":{json.dumps(connection_id)},"{SEQ}":{int(frame.seq)},'
        f'"{FENCE_TOKEN}":{int(fence_token)},"{WORKER_ID}":{json.dumps(worker_id)},'
        f'"{RECEIVED_AT_MS}":{int(frame.received_at_ms)},'
    )
    if data_ref is not None:
        ref, size, sha256 = data_ref
        tail = f'"{DATA_REF}":{json.dumps(ref)},"{DATA_BYTES}":{int(size)},"{DATA_SHA256}":{json.dumps(sha256)}'
        tail += f',"{DATA_FORMAT}":"{schema.DATA_FORMAT_BINARY}"}}' if frame.binary else "}"
    elif frame.data_json is not None:
        tail = f'"{DATA_BASE64 if frame.binary else DATA}":{frame.data_json}}}'
    else:
        tail = f'"{SKIPPED}":{json.dumps(frame.reason)}'
        if frame.data_bytes is not None:
            tail += f',"{DATA_BYTES}":{int(frame.data_bytes)}'
        if frame.skip_to is not None:
            tail += f',"{SKIP_TO}":{int(frame.skip_to)}'
        tail += "}"
    return (head + tail).encode("utf-8")


@dataclass(frozen=True)
class Record:
    """A decoded record. ``data`` is the decoded JSON value (None for a marker or a
    reference; a frame whose data is JSON null has ``has_data`` True)."""

    connection_id: str
    seq: int
    fence_token: int
    worker_id: str
    received_at_ms: int
    has_data: bool
    data: Any = None
    data_ref: str | None = None
    data_bytes: int | None = None
    data_sha256: str | None = None
    skipped: str | None = None
    skip_to: int | None = None
    data_base64: str | None = None  # a binary feed's frame
    data_format: str | None = None  # "binary" for a binary feed's data_ref

    def delivered(self) -> dict[str, Any]:
        """Its data as a reader is given it (besides seq, fence, worker and time): the
        data, a binary frame's data_base64, large data's reference, or the marker."""
        if self.has_data:
            return {DATA: self.data}
        if self.data_base64 is not None:
            return {DATA_BASE64: self.data_base64}
        if self.data_ref is not None:
            out = {DATA_REF: self.data_ref, DATA_BYTES: self.data_bytes, DATA_SHA256: self.data_sha256}
            return {**out, DATA_FORMAT: self.data_format} if self.data_format is not None else out
        out = {SKIPPED: self.skipped}
        return out | {k: v for k, v in ((DATA_BYTES, self.data_bytes), (SKIP_TO, self.skip_to)) if v is not None}

    @property
    def end(self) -> int:
        """The last seq this record stands for: its own, or a range marker's ``skip_to``."""
        return self.seq if self.skip_to is None else self.skip_to

    @property
    def is_marker(self) -> bool:
        return self.skipped is not None


class BadRecord(ValueError):
    """Bytes that are not a wsfleet record (another producer on the stream, damage)."""


def decode(raw: bytes | str) -> Record:
    """A record back from its bytes; :class:`BadRecord` with a sentence if it is not one."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRecord(f"not JSON: {exc}") from None
    except RecursionError:  # nesting deeper than the parser goes: hostile, not ours
        raise BadRecord("not a record: JSON nested too deep to read") from None
    if not isinstance(doc, dict):
        raise BadRecord("not a JSON object")

    def whole(name: str, *, required: bool = True) -> int | None:
        value = doc.get(name)
        if value is None and not required:
            return None
        if type(value) is not int:  # noqa: E721 - bool is not a seq
            raise BadRecord(f"{name} must be a whole number, got {value!r}")
        return value

    def text(name: str, *, required: bool = True) -> str | None:
        value = doc.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str):
            raise BadRecord(f"{name} must be a string, got {type(value).__name__}")
        return value

    kinds = [k for k in (DATA, DATA_BASE64, DATA_REF, SKIPPED) if k in doc]
    if len(kinds) != 1:
        raise BadRecord(
            f"a record has exactly one of {DATA}, {DATA_BASE64}, {DATA_REF}, {SKIPPED}; this one has {kinds or 'none'}"
        )
    skipped = text(SKIPPED, required=False)
    if skipped is not None and skipped not in schema.SKIPPED_REASONS:
        raise BadRecord(f"{SKIPPED} must be one of {', '.join(schema.SKIPPED_REASONS)}, got {skipped!r}")
    return Record(
        connection_id=text(CONNECTION_ID),  # type: ignore[arg-type]
        seq=whole(SEQ),  # type: ignore[arg-type]
        fence_token=whole(FENCE_TOKEN),  # type: ignore[arg-type]
        worker_id=text(WORKER_ID),  # type: ignore[arg-type]
        received_at_ms=whole(RECEIVED_AT_MS),  # type: ignore[arg-type]
        has_data=DATA in doc,
        data=doc.get(DATA),
        data_ref=text(DATA_REF, required=DATA_REF in doc),
        data_bytes=whole(DATA_BYTES, required=False),
        data_sha256=text(DATA_SHA256, required=DATA_REF in doc),
        skipped=skipped,
        skip_to=whole(SKIP_TO, required=False),
        data_base64=text(DATA_BASE64, required=False),
        data_format=text(DATA_FORMAT, required=False),
    )


def newer(a: Record, b: Record) -> bool:
    """Whether ``a`` supersedes ``b`` for one (connection, seq) under the consumer rule:
    the higher fence wins; at one fence they are the same frame sent again."""
    return a.fence_token > b.fence_token
