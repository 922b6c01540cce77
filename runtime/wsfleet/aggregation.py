"""The Kinesis aggregated record format (the Kinesis Producer Library's): several user
records in one Kinesis record, which the consumer libraries (KCL, the Lambda
deaggregation modules for Python, Node.js, Java, Go) unpack. The stream sink packs one
connection's frames of a flush into one (:mod:`wsfleet.sinks.kinesis`); the reference
consumer, the CLI and the local audits unpack it (:func:`unpack`).

A Kinesis record's data is either a plain user record or::

    F3 89 9A C2 | AggregatedRecord, protobuf (proto2) | MD5 of the protobuf bytes (16)

    message AggregatedRecord {
      repeated string partition_key_table = 1;
      repeated string explicit_hash_key_table = 2;
      repeated Record records = 3;
    }
    message Record {
      required uint64 partition_key_index = 1;      // into partition_key_table
      optional uint64 explicit_hash_key_index = 2;  // into explicit_hash_key_table
      required bytes data = 3;
      repeated Tag tags = 4;
    }
    message Tag { required string key = 1; optional string value = 2; }

Written here rather than taken from a library: the three messages need a varint and a
length prefix, the worker image keeps no protobuf runtime of its own for it, and the
registry's ``aws-kinesis-agg`` ships protobuf code generated for an old protobuf.
:func:`pack` writes one partition key (the Kinesis record's own) and neither explicit
hash keys nor tags; :func:`unpack` reads any aggregate (tags and unknown fields
skipped, as protobuf does). Data that does not start with the magic bytes, or whose
digest does not match, is a plain record, as KCL takes it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

MAGIC = b"\xf3\x89\x9a\xc2"
DIGEST_BYTES = 16  # MD5

# Field numbers and wire types (protobuf's encoding).
_VARINT, _LEN = 0, 2
_AGG_KEYS, _AGG_HASH_KEYS, _AGG_RECORDS = 1, 2, 3
_REC_KEY_INDEX, _REC_HASH_KEY_INDEX, _REC_DATA = 1, 2, 3


class BadAggregate(ValueError):
    """An aggregate whose digest matches but whose protobuf is not an AggregatedRecord."""


@dataclass(frozen=True)
class UserRecord:
    """One record of an aggregate: its partition key, explicit hash key (None: none)
    and data; ``index`` is its place in the aggregate (KCL's subsequence number)."""

    partition_key: str
    explicit_hash_key: str | None
    data: bytes
    index: int


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _varint_len(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def _record_len(data_len: int) -> int:
    """The bytes of a Record message holding ``data_len`` bytes under key index 0."""
    return 2 + 1 + _varint_len(data_len) + data_len


def overhead_bytes(partition_key: str) -> int:
    """An aggregate's bytes besides its records: the magic, the digest and the key table."""
    key = len(partition_key.encode("utf-8"))
    return len(MAGIC) + DIGEST_BYTES + 1 + _varint_len(key) + key


def entry_bytes(data_len: int) -> int:
    """What one record of ``data_len`` bytes adds to an aggregate."""
    inner = _record_len(data_len)
    return 1 + _varint_len(inner) + inner


def pack(partition_key: str, datas: Sequence[bytes]) -> bytes:
    """One aggregate of ``datas``, in their order, all under ``partition_key``; its size
    is ``overhead_bytes(partition_key) + sum(entry_bytes(len(d)) for d in datas)``."""
    key = partition_key.encode("utf-8")
    body = [bytes([_AGG_KEYS << 3 | _LEN]), _varint(len(key)), key]
    for data in datas:
        inner_len = _record_len(len(data))
        body += [bytes([_AGG_RECORDS << 3 | _LEN]), _varint(inner_len),
                 bytes([_REC_KEY_INDEX << 3 | _VARINT, 0, _REC_DATA << 3 | _LEN]), _varint(len(data)), data]
    message = b"".join(body)
    return MAGIC + message + hashlib.md5(message, usedforsecurity=False).digest()


def is_aggregate(raw: bytes) -> bool:
    """Whether ``raw`` is an aggregate: the magic bytes, and the digest of what follows."""
    if len(raw) < len(MAGIC) + DIGEST_BYTES or not raw.startswith(MAGIC):
        return False
    message, digest = raw[len(MAGIC):-DIGEST_BYTES], raw[-DIGEST_BYTES:]
    return hashlib.md5(message, usedforsecurity=False).digest() == digest


def unpack(raw: bytes) -> list[UserRecord] | None:
    """The user records of an aggregate, in order; None if ``raw`` is a plain record.
    :class:`BadAggregate` (with a sentence) for an aggregate that does not parse or
    names a key its tables do not have."""
    if not is_aggregate(raw):
        return None
    keys: list[str] = []
    hash_keys: list[str] = []
    found: list[tuple[int, int | None, bytes]] = []
    for number, value in _fields(memoryview(raw)[len(MAGIC):-DIGEST_BYTES], "AggregatedRecord"):
        if number == _AGG_KEYS:
            keys.append(_text(value, "a partition key"))
        elif number == _AGG_HASH_KEYS:
            hash_keys.append(_text(value, "an explicit hash key"))
        elif number == _AGG_RECORDS:
            found.append(_record(value))
    out = []
    for index, (key_index, hash_index, data) in enumerate(found):
        if key_index >= len(keys):
            raise BadAggregate(f"record {index} names partition key {key_index}; the table has {len(keys)}")
        if hash_index is not None and hash_index >= len(hash_keys):
            raise BadAggregate(f"record {index} names explicit hash key {hash_index}; the table has {len(hash_keys)}")
        out.append(UserRecord(keys[key_index], None if hash_index is None else hash_keys[hash_index], data, index))
    return out


def user_records(raw: bytes, partition_key: str) -> list[UserRecord]:
    """What a consumer library hands on for one Kinesis record: an aggregate's user
    records, or the plain record itself (index 0, the Kinesis record's partition key).
    :class:`BadAggregate` as :func:`unpack`."""
    inner = unpack(raw)
    return [UserRecord(partition_key, None, raw, 0)] if inner is None else inner


def _record(value: object) -> tuple[int, int | None, bytes]:
    key_index = hash_index = data = None
    for number, field in _fields(_bytes(value, "a record"), "Record"):
        if number == _REC_KEY_INDEX:
            key_index = _whole(field, "partition_key_index")
        elif number == _REC_HASH_KEY_INDEX:
            hash_index = _whole(field, "explicit_hash_key_index")
        elif number == _REC_DATA:
            data = bytes(_bytes(field, "data"))
    if key_index is None or data is None:
        raise BadAggregate("a record without its partition_key_index or data")
    return key_index, hash_index, data


def _fields(buf: memoryview, message: str):
    """(field number, value) of a protobuf message: an int for a varint, a memoryview
    for a length-delimited field; fixed-width fields skipped."""
    at = 0
    while at < len(buf):
        tag, at = _read_varint(buf, at, message)
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            value, at = _read_varint(buf, at, message)
            yield number, value
        elif wire == _LEN:
            size, at = _read_varint(buf, at, message)
            if at + size > len(buf):
                raise BadAggregate(f"{message}: field {number} runs past the end")
            yield number, buf[at:at + size]
            at += size
        elif wire in (1, 5):  # 64- and 32-bit: no field of these messages, skipped
            at += 8 if wire == 1 else 4
            if at > len(buf):
                raise BadAggregate(f"{message}: field {number} runs past the end")
        else:
            raise BadAggregate(f"{message}: wire type {wire} of field {number} is not one protobuf writes here")


def _read_varint(buf: memoryview, at: int, message: str) -> tuple[int, int]:
    value = shift = 0
    while at < len(buf):
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            break
    raise BadAggregate(f"{message}: a varint is cut short or longer than 10 bytes")


def _bytes(value: object, what: str) -> memoryview:
    if not isinstance(value, memoryview):
        raise BadAggregate(f"{what} is not length-delimited")
    return value


def _whole(value: object, what: str) -> int:
    if not isinstance(value, int):
        raise BadAggregate(f"{what} is not a varint")
    return value


def _text(value: object, what: str) -> str:
    try:
        return bytes(_bytes(value, what)).decode("utf-8")
    except UnicodeDecodeError:
        raise BadAggregate(f"{what} is not UTF-8") from None
