"""The Kinesis aggregated record format (wsfleet.aggregation) against protobuf's own
runtime as the independent reader and writer: the messages declared here from the
format's definition, not from our code."""

from __future__ import annotations

import hashlib

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from wsfleet import aggregation
from wsfleet.aggregation import BadAggregate, UserRecord, entry_bytes, overhead_bytes, pack, unpack

F = descriptor_pb2.FieldDescriptorProto


def _classes():
    """AggregatedRecord, Record and Tag as the Kinesis Producer Library declares them."""
    fdp = descriptor_pb2.FileDescriptorProto(name="kpl_messages.proto", package="kpl", syntax="proto2")
    tag = fdp.message_type.add(name="Tag")
    tag.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_REQUIRED)
    tag.field.add(name="value", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    rec = fdp.message_type.add(name="Record")
    rec.field.add(name="partition_key_index", number=1, type=F.TYPE_UINT64, label=F.LABEL_REQUIRED)
    rec.field.add(name="explicit_hash_key_index", number=2, type=F.TYPE_UINT64, label=F.LABEL_OPTIONAL)
    rec.field.add(name="data", number=3, type=F.TYPE_BYTES, label=F.LABEL_REQUIRED)
    rec.field.add(name="tags", number=4, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED, type_name=".kpl.Tag")
    agg = fdp.message_type.add(name="AggregatedRecord")
    agg.field.add(name="partition_key_table", number=1, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    agg.field.add(name="explicit_hash_key_table", number=2, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    agg.field.add(name="records", number=3, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED, type_name=".kpl.Record")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("kpl.AggregatedRecord"))


AggregatedRecord = _classes()


def framed(message: bytes) -> bytes:
    return aggregation.MAGIC + message + hashlib.md5(message).digest()


@pytest.mark.parametrize("sizes", [[0], [1, 2, 3], [125, 126, 127, 128, 16_383, 16_384], [200_000, 50, 300_000]])
def test_an_aggregate_is_the_magic_an_aggregated_record_protobuf_reads_and_its_md5_and_its_size_is_known_before(sizes):
    key = "conn-é☃"
    datas = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    raw = pack(key, datas)
    assert len(raw) == overhead_bytes(key) + sum(entry_bytes(n) for n in sizes)
    assert raw[:4] == b"\xf3\x89\x9a\xc2" and raw[-16:] == hashlib.md5(raw[4:-16]).digest()
    parsed = AggregatedRecord.FromString(raw[4:-16])
    assert list(parsed.partition_key_table) == [key] and list(parsed.explicit_hash_key_table) == []
    assert [r.data for r in parsed.records] == datas
    assert all(r.partition_key_index == 0 and not r.HasField("explicit_hash_key_index") for r in parsed.records)
    assert unpack(raw) == [UserRecord(key, None, d, i) for i, d in enumerate(datas)]


def test_an_aggregate_protobuf_wrote_with_several_keys_hash_keys_and_tags_unpacks_in_order():
    agg = AggregatedRecord(partition_key_table=["a", "b"], explicit_hash_key_table=["12345"])
    agg.records.add(partition_key_index=1, data=b"one", tags=[{"key": "k", "value": "v"}])
    agg.records.add(partition_key_index=0, explicit_hash_key_index=0, data=b"")
    agg.records.add(partition_key_index=1, data=b"\xf3\x89three")
    assert unpack(framed(agg.SerializeToString())) == [
        UserRecord("b", None, b"one", 0), UserRecord("a", "12345", b"", 1), UserRecord("b", None, b"\xf3\x89three", 2),
    ]


def test_plain_data_and_a_digest_that_does_not_match_are_plain_records():
    assert unpack(b'{"connection_id":"a"}') is None
    assert unpack(aggregation.MAGIC) is None
    raw = bytearray(pack("a", [b"x", b"y"]))
    raw[-1] ^= 1
    assert unpack(bytes(raw)) is None


@pytest.mark.parametrize(("message", "why"), [
    (b"\x1a\x05\x08\x00", "runs past the end"),
    (b"\x0a\x01a\x1a\x02\x08\x00", "without its partition_key_index or data"),
    (b"\x0a\x01a\x1a\x05\x08\x01\x1a\x01x", "names partition key 1; the table has 1"),
    (b"\x0a\x02\xff\xfe", "not UTF-8"),
    (b"\x0b", "wire type 3"),
    (b"\x08" + b"\xff" * 11, "varint"),
])
def test_an_aggregate_whose_protobuf_is_damaged_is_refused_with_a_sentence(message, why):
    with pytest.raises(BadAggregate, match=why):
        unpack(framed(message))


# Written by the registry's aws-kinesis-agg 1.2.3 (RecordAggregator.add_user_record of
# ("conn-1", b'{"seq":1}'), ("conn-2", b'{"seq":2}', explicit_hash_key "1234...890"),
# ("conn-1", b'{"seq":3}')); its deaggregator reads what pack writes back the same way.
LIBRARY_AGGREGATE = bytes.fromhex(
    "f3899ac20a06636f6e6e2d310a06636f6e6e2d32121431323334353637383930313233343536373839301a0d08001a097b22736571223a"
    "317d1a0f080110001a097b22736571223a327d1a0d08001a097b22736571223a337d3b1ec1d99cf0021ecbe998ed704308b6"
)


def test_an_aggregate_the_kinesis_aggregation_library_wrote_unpacks_to_its_records():
    assert unpack(LIBRARY_AGGREGATE) == [
        UserRecord("conn-1", None, b'{"seq":1}', 0),
        UserRecord("conn-2", "12345678901234567890", b'{"seq":2}', 1),
        UserRecord("conn-1", None, b'{"seq":3}', 2),
    ]
