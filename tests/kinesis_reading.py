"""Reading a test's messages stream back: every record of every shard, decoded, and the
ordering rules the sink promises checked per connection."""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

from wsfleet import records
from sim import stream_audit
from sim.emulator import create_resources


def kinesis_env(endpoint_url: str, sink: str = "kinesis", shards: int = 2) -> dict[str, str]:
    """Fresh resources with a messages stream of their own (``SINK`` = ``sink``)."""
    s = uuid.uuid4().hex[:8]
    return create_resources(
        endpoint_url, table_name=f"c-{s}", sessions_table_name=f"s-{s}", messages_table_name=f"m-{s}",
        messages_bucket_name=f"b-{s}", queue_name=f"q-{s}", sink=sink, messages_stream_name=f"ms-{s}",
        stream_shards=shards,
    )


def read_stream(kinesis: Any, stream: str) -> dict[str, list[tuple[str, records.Record]]]:
    """Every record on the stream, decoded, by shard id, in shard order: (shard, record)
    (the harness's reader, :func:`sim.stream_audit.read_stream`; a record that
    does not decode fails the test)."""
    out: dict[str, list[tuple[str, records.Record]]] = {}
    for d in stream_audit.read_stream(kinesis, stream):
        if d.record is None:
            raise records.BadRecord(d.error)
        out.setdefault(d.shard_id, []).append((d.shard_id, d.record))
    return out


def by_connection(kinesis: Any, stream: str) -> dict[str, list[records.Record]]:
    """Each connection's records in stream order; asserts one connection is on one shard."""
    out: dict[str, list[records.Record]] = defaultdict(list)
    shard_of: dict[str, str] = {}
    for sid, recs in read_stream(kinesis, stream).items():
        for _, rec in recs:
            assert shard_of.setdefault(rec.connection_id, sid) == sid, f"{rec.connection_id} on two shards"
            out[rec.connection_id].append(rec)
    return dict(out)


def last_deliveries(recs: list[records.Record]) -> list[records.Record]:
    """The last delivery of each seq, in stream order."""
    last = {r.seq: i for i, r in enumerate(recs)}
    return [r for i, r in enumerate(recs) if last[r.seq] == i]


def check_order(recs: list[records.Record]) -> None:
    """The stream rules for one connection: the last deliveries in increasing seq order,
    every seq from the first to the last delivered at least once (a marker stands for
    its range), and a seq delivered twice at the same or a higher fence, never lower."""
    last = last_deliveries(recs)
    assert [r.seq for r in last] == sorted(r.seq for r in last), f"last deliveries out of order: {[r.seq for r in last]}"
    covered: set[int] = set()
    for r in recs:
        covered.update(range(r.seq, r.end + 1))
    if covered:
        assert covered == set(range(min(covered), max(covered) + 1)), "a seq never delivered"
    seen: dict[int, int] = {}
    for r in recs:
        assert r.fence_token >= seen.get(r.seq, 0), f"seq {r.seq} delivered again with a lower fence"
        seen[r.seq] = r.fence_token
