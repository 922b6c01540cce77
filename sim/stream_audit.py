"""The messages stream read back whole, and audited against CONTRACT.md section 4's
at-least-once rule: what ``SINK=kinesis`` runs (the demo, the fleet tests, chaos) are
judged by.

Reading (:func:`read_stream`) is the harness's: every record of every shard from
TRIM_HORIZON, in each shard's order, with its shard id and sequence number, an
aggregated Kinesis record unpacked into its user records (:mod:`wsfleet.aggregation`,
as a consumer library does), each a :class:`Delivery` of its own: the rules below are
the per-frame records' whatever record carried them. A record that does not decode
(:func:`wsfleet.records.decode`) is kept, as a finding.

The audit (:func:`audit`) is a pure function of that read, the acquisitions and
checkpoints of the emulator's journal (:func:`acquisitions`: independent of the
workers' claims) and, where given, what the upstream produced. Per connection, the
rules it checks:

* ``shards``: every record of a connection is on one shard, under the connection id
  as its partition key (else nothing orders them);
* ``gap``: every seq from the first delivered to the last is delivered at least once
  by a record that is not ``stale`` (a skip marker stands for seq..skip_to), from the
  first acquisition's checkpoint on where the journal has it, and every
  seq up to the connection's last checkpoint (a checkpoint is never ahead of the
  stream): the consumer drops a stale record, so a seq only a stale one carries is lost;
* ``order``: the last delivery of each seq comes after the last delivery of every
  lower seq (what a consumer that keeps the highest fence sees is in seq order);
  a delivery with a lower fence than one already on the stream (``stale``) is left out
  of this: the consumer's rule drops it;
* ``duplicate``: a seq delivered again is either a resend (the same fence: a partly
  refused or ambiguous PutRecords; counted), or a takeover (a higher fence) of a seq
  above the checkpoint the journal shows at that fence's acquisition;
* ``bound``: the seqs a takeover delivers again were received by the previous owners
  within ``window_s`` (CHECKPOINT_SECONDS + the takeover time) of their last frame;
* ``stale``: a lower fence after a higher one, unless ``excuse`` says why (a writer
  frozen with its request past its last deadline check);
* ``data``: what ``check`` says of a record (default: the upstream's data for that
  seq, or its size and SHA-256 for data stored in the bucket).

A consumer's view (:func:`consumer_view`: per (connection, seq) the highest fence, the
last delivery of it) turns the stream into the table's items, for the audits written
for the table (:mod:`.kind_streams`, the chaos data checks).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from wsfleet import aggregation, records, schema
from wsfleet.records import BadRecord, Record

GET_RECORDS_LIMIT = 10_000  # Kinesis' most per GetRecords


@dataclass(frozen=True)
class Delivery:
    """One (user) record as read from the stream; ``position``: its place in the whole
    read (shard by shard, each in its own order), which only compares within one shard;
    ``sub_sequence``: its place in its aggregate (None: a plain Kinesis record)."""

    position: int
    shard_id: str
    sequence_number: str
    partition_key: str
    record: Record | None
    error: str = ""  # why it did not decode
    arrived_at: float | None = None  # epoch s: Kinesis' ApproximateArrivalTimestamp
    sub_sequence: int | None = None


def _stream_ref(name: str) -> dict[str, str]:
    return {"StreamARN": name} if name.startswith("arn:") else {"StreamName": name}


def read_stream(kinesis: Any, stream: str) -> list[Delivery]:
    """Every record of ``stream`` (a name or an ARN), shard by shard, each from
    TRIM_HORIZON to the end of what it holds now, aggregates unpacked. ``kinesis``: a
    harness client (its reads must never meet the emulator's faults)."""
    out: list[Delivery] = []
    for shard_id, raw in kinesis_records(kinesis, stream):
        out += _deliveries(len(out), shard_id, raw)
    return out


def kinesis_records(kinesis: Any, stream: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(shard id, GetRecords' record) of every Kinesis record of ``stream``, as stored
    (an aggregate whole), shard by shard, each from TRIM_HORIZON to its end now."""
    ref = _stream_ref(stream)
    shards: list[str] = []
    kwargs: dict[str, Any] = dict(ref)
    while True:
        page = kinesis.list_shards(**kwargs)
        shards += [s["ShardId"] for s in page.get("Shards", [])]
        if not page.get("NextToken"):
            break
        kwargs = {"NextToken": page["NextToken"]}
    for shard_id in sorted(shards):
        iterator = kinesis.get_shard_iterator(**ref, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            page = kinesis.get_records(ShardIterator=iterator, Limit=GET_RECORDS_LIMIT)
            for raw in page.get("Records", []):
                yield shard_id, raw
            if not page.get("Records"):
                break  # at the end of what the shard holds (an open shard's iterator never ends)
            iterator = page.get("NextShardIterator")


def _deliveries(position: int, shard_id: str, raw: Mapping[str, Any]) -> list[Delivery]:
    """The user records of one Kinesis record, from ``position`` on."""
    arrived = raw.get("ApproximateArrivalTimestamp")
    at = arrived.timestamp() if isinstance(arrived, dt.datetime) else None
    sequence_number, key = raw.get("SequenceNumber", ""), raw.get("PartitionKey", "")
    try:
        inner = aggregation.unpack(raw["Data"])
    except aggregation.BadAggregate as exc:
        return [Delivery(position, shard_id, sequence_number, key, None, f"an aggregate that does not parse: {exc}", at)]
    if inner is None:
        return [_delivery(position, shard_id, sequence_number, key, raw["Data"], at, None)]
    return [
        _delivery(position + u.index, shard_id, sequence_number, u.partition_key, u.data, at, u.index,
                  error="" if u.partition_key == key else f"in an aggregate under partition key {key!r}")
        for u in inner
    ]


def _delivery(position: int, shard_id: str, sequence_number: str, key: str, data: bytes, at: float | None,
              sub_sequence: int | None, *, error: str = "") -> Delivery:
    if error:
        return Delivery(position, shard_id, sequence_number, key, None, error, at, sub_sequence)
    try:
        record, error = records.decode(data), ""
    except BadRecord as exc:
        record, error = None, str(exc)
    return Delivery(position, shard_id, sequence_number, key, record, error, at, sub_sequence)


# --- what the journal says -----------------------------------------------------------------


@dataclass(frozen=True)
class Acquisition:
    """A fence's acquisition, with the checkpoint the connection had then (the last
    ``last_seq`` written before it, in the order DynamoDB applied them) and whether
    the last owner released it cleanly (its release stored the exact end)."""

    connection_id: str
    fence: int
    checkpoint: int
    t_ms: int
    clean: bool


def acquisitions(journal: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, Acquisition]]:
    """Per connection, per fence: its acquisition, from the emulator's journal
    (``update`` entries; ``checkpoint`` and ``release`` entries move ``last_seq``)."""
    last_seq: dict[str, int] = {}
    clean: dict[str, bool] = {}
    out: dict[str, dict[int, Acquisition]] = {}
    for e in journal:
        pk = e.get("pk")
        if not isinstance(pk, str) or not pk.startswith(schema.connection_pk("")):
            continue
        cid = schema.connection_id_from_pk(pk)
        op = e.get("op")
        if op in ("checkpoint", "release") and e.get("last_seq") is not None:
            last_seq[cid] = int(e["last_seq"])
            clean[cid] = op == "release"
        elif op == "update" and e.get("fence") is not None:
            fence = int(e["fence"])
            out.setdefault(cid, {}).setdefault(
                fence, Acquisition(cid, fence, last_seq.get(cid, 0), int(e.get("t_ms") or 0), clean.get(cid, False))
            )
            clean[cid] = False
    return out


# --- the audit ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    kind: str  # shards, gap, order, duplicate, bound, stale, data, bad_record
    connection_id: str
    sentence: str


@dataclass(frozen=True)
class Takeover:
    """What one acquisition delivered again: ``again`` seqs the lower fences had
    delivered, against ``bound`` (what the previous owners received within the window
    before their last frame)."""

    connection_id: str
    fence: int
    checkpoint: int | None  # None: no acquisition of this fence in the journal
    again: int
    bound: int
    clean: bool = False


@dataclass
class StreamAudit:
    records: int = 0  # user records (a frame's or a marker's), unpacked
    kinesis_records: int = 0  # the Kinesis records that carried them (aggregates or plain)
    carriers: str = "Kinesis records"  # what kinesis_records counts (the delivery stream's: lines)
    connections: int = 0
    delivered: int = 0  # distinct (connection, seq) pairs, a marker's range counted whole
    resent: int = 0  # deliveries again with the same fence
    again_after_takeover: int = 0  # deliveries again with a higher fence
    stale: int = 0  # a lower fence after a higher one
    stale_excused: int = 0
    takeovers: list[Takeover] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def worst(self) -> Takeover | None:
        """The takeover that delivered the most again, relative to its bound."""
        counted = [t for t in self.takeovers if t.again]
        return max(counted, key=lambda t: (t.again - t.bound, t.again), default=None)

    def lines(self) -> list[str]:
        worst = self.worst
        out = [
            f"stream: {self.records} records in {self.kinesis_records} {self.carriers} for {self.connections} "
            f"connections; {self.delivered} seqs delivered; "
            f"again: {self.resent} resent with the same fence (a partly refused or unanswered PutRecords), "
            f"{self.again_after_takeover} with a higher fence after {sum(1 for t in self.takeovers if t.again)} takeovers"
            + (f" (most: {worst.again} by {worst.connection_id} fence {worst.fence}, bound {worst.bound})" if worst else ""),
        ]
        if self.stale:
            out.append(f"  {self.stale} records with a fence below one already on the stream ({self.stale_excused} excused)")
        out.append(f"  at-least-once and ordering violations: {len(self.findings)}")
        out += [f"  {f.kind.upper()} {f.connection_id}: {f.sentence}" for f in self.findings[:20]]
        if len(self.findings) > 20:
            out.append(f"  ... and {len(self.findings) - 20} more")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "records": self.records, "kinesis_records": self.kinesis_records, "connections": self.connections,
            "delivered": self.delivered,
            "resent": self.resent, "again_after_takeover": self.again_after_takeover, "stale": self.stale,
            "stale_excused": self.stale_excused, "ok": self.ok,
            "takeovers": [vars(t) for t in self.takeovers if t.again],
            "findings": [vars(f) for f in self.findings],
        }


Check = Callable[[str, Record], "str | None"]


def expected_data(expected: Mapping[str, Mapping[int, str | None]]) -> Check:
    """The default data check: a record holds what the upstream sent as its seq (the
    same JSON value), or for data in the bucket its size and SHA-256; a marker is a
    finding (the default protocol's streams skip nothing). Connections absent from
    ``expected`` are not checked."""

    def check(cid: str, r: Record) -> str | None:
        if cid not in expected:
            return None
        want = expected[cid].get(r.seq)
        if r.is_marker:
            return f"seq {r.seq} is a {r.skipped} marker; the upstream sent {'nothing as that seq' if want is None else 'a frame'}"
        if want is None:
            return f"seq {r.seq} holds data; the upstream never sent a frame with that seq and data"
        if r.data_ref is not None:
            body = want.encode("utf-8")
            if (r.data_bytes, r.data_sha256) != (len(body), hashlib.sha256(body).hexdigest()):
                return f"seq {r.seq}'s data_ref says {r.data_bytes} bytes, SHA-256 {r.data_sha256}; the upstream sent {len(body)} bytes"
            return None
        if r.data != json.loads(want):
            return f"seq {r.seq} holds {json.dumps(r.data)[:80]}; the upstream sent {want[:80]}"
        return None

    return check


def audit(
    deliveries: Sequence[Delivery],
    acquired: Mapping[str, Mapping[int, Acquisition]],
    *,
    window_s: float,
    checkpoints: Mapping[str, int] | None = None,
    check: Check | None = None,
    excuse: Callable[[Delivery], bool] | None = None,
) -> StreamAudit:
    """The rules of the module's docstring over one read of the stream. ``acquired``:
    :func:`acquisitions` of the journal; ``checkpoints``: each connection's last
    ``last_seq`` (every seq up to it must be on the stream)."""
    result = StreamAudit(records=len(deliveries), kinesis_records=len({(d.shard_id, d.sequence_number) for d in deliveries}))
    by_cid: dict[str, list[Delivery]] = {}
    for d in deliveries:
        if d.record is None:
            result.findings.append(Finding("bad_record", d.partition_key, f"{d.shard_id} {d.sequence_number}: {d.error}"))
            continue
        by_cid.setdefault(d.record.connection_id, []).append(d)
    for cid in checkpoints or {}:
        by_cid.setdefault(cid, [])
    result.connections = len(by_cid)
    for cid, mine in sorted(by_cid.items()):
        _audit_connection(result, cid, mine, acquired.get(cid, {}), window_s=window_s,
                          checkpoint=(checkpoints or {}).get(cid, 0), check=check, excuse=excuse)
    return result


def _ranges(seqs: Iterable[int]) -> str:
    spans: list[list[int]] = []
    for s in sorted(seqs):
        if spans and spans[-1][1] == s - 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:5])
    return text + (f" and {len(spans) - 5} more ranges" if len(spans) > 5 else "")


def _audit_connection(
    result: StreamAudit, cid: str, mine: list[Delivery], acquired: Mapping[int, Acquisition], *,
    window_s: float, checkpoint: int, check: Check | None, excuse: Callable[[Delivery], bool] | None,
) -> None:
    def finding(kind: str, sentence: str) -> None:
        result.findings.append(Finding(kind, cid, sentence))

    shards = sorted({d.shard_id for d in mine})
    if len(shards) > 1:
        finding("shards", f"its records are on {len(shards)} shards ({', '.join(shards)}): nothing orders them")
    keys = sorted({d.partition_key for d in mine} - {cid})
    if keys:
        finding("shards", f"records under partition key {keys[0]!r}, not the connection id")
    mine = sorted(mine, key=lambda d: d.position)

    top_fence = 0
    stale: set[int] = set()  # positions
    seen: dict[int, list[Delivery]] = {}  # seq -> its deliveries so far, in stream order
    last: dict[int, Delivery] = {}  # seq -> its last delivery that is not stale
    for d in mine:
        r = d.record
        assert r is not None
        if check is not None and (problem := check(cid, r)) is not None:
            finding("data", problem)
        if r.fence_token < top_fence:
            result.stale += 1
            stale.add(d.position)
            if excuse is not None and excuse(d):
                result.stale_excused += 1
            else:
                finding("stale", f"seq {r.seq} with fence {r.fence_token} ({r.worker_id}) after fence {top_fence} "
                                 f"was on the stream ({d.shard_id} {d.sequence_number})")
            for s in range(r.seq, r.end + 1):
                seen.setdefault(s, []).append(d)
            continue
        top_fence = r.fence_token
        for s in range(r.seq, r.end + 1):
            seen.setdefault(s, []).append(d)
            last[s] = d

    if not seen and checkpoint <= 0:
        return
    # Delivered means by a record that is not stale: the consumer drops a stale one
    # (the higher fence owes that seq itself), so a seq only a stale record carries is lost.
    first, end = (min(last), max(last)) if last else (1, 0)
    if acquired and last:  # an owner resumes after the checkpoint it acquired: from there on, no hole
        first = min(first, min(a.checkpoint for a in acquired.values()) + 1)
    missing = [s for s in range(first, max(end, checkpoint) + 1) if s not in last]
    if missing:
        finding("gap", f"seqs {_ranges(missing)} never delivered (first {first}, last {end}, checkpoint {checkpoint})")
    result.delivered += len(seen)

    # The consumer's order: walking up the seqs, each one's last delivery is later.
    prev: tuple[int, Delivery] | None = None
    disorder = []
    for s in sorted(last):
        d = last[s]
        if prev is not None and d.position < prev[1].position:
            disorder.append(f"seq {s} (fence {d.record.fence_token}, {d.sequence_number}) before seq {prev[0]} "
                            f"(fence {prev[1].record.fence_token}, {prev[1].sequence_number})")
        prev = (s, d)
    if disorder:
        finding("order", f"{len(disorder)} seqs last delivered out of order, first: {disorder[0]}")

    # Deliveries again: the same fence is a resend; a higher one a takeover's.
    again: dict[int, set[int]] = {}  # fence -> seqs it delivered again
    for s, ds in seen.items():
        for i, d in enumerate(ds[1:], 1):
            if d.position in stale:
                continue  # counted as stale: the consumer's rule drops it
            fence = d.record.fence_token
            if any(e.record.fence_token == fence for e in ds[:i]):
                result.resent += 1  # its own fence's again (a takeover's own resend too)
            elif any(e.record.fence_token < fence for e in ds[:i]):
                result.again_after_takeover += 1
                again.setdefault(fence, set()).add(s)
    for fence, seqs in sorted(again.items()):
        acq = acquired.get(fence)
        older = [d for d in mine if d.record.fence_token < fence]
        bound = _bound(older, window_s)
        result.takeovers.append(Takeover(cid, fence, acq.checkpoint if acq else None, len(seqs), bound, acq.clean if acq else False))
        if acq is None:
            finding("duplicate", f"fence {fence} delivered seqs {_ranges(seqs)} again, and the journal holds no acquisition of it")
            continue
        below = [s for s in seqs if s <= acq.checkpoint]
        if below:
            finding("duplicate", f"fence {fence} delivered seqs {_ranges(below)} again, at or below the checkpoint "
                                 f"{acq.checkpoint} it was acquired with")
        if len(seqs) > bound:
            finding("bound", f"fence {fence} delivered {len(seqs)} seqs again ({_ranges(seqs)}); the previous owners "
                             f"received {bound} within {window_s:g}s of their last frame")
    for fence, acq in acquired.items():
        if fence not in again:
            result.takeovers.append(Takeover(cid, fence, acq.checkpoint, 0, 0, acq.clean))


def _bound(older: Sequence[Delivery], window_s: float) -> int:
    """The seqs the lower fences' records were received within ``window_s`` of the
    last of them (by the writers' clocks: ``received_at_ms``)."""
    if not older:
        return 0
    newest = max(d.record.received_at_ms for d in older)
    recent: set[int] = set()
    for d in older:
        if d.record.received_at_ms >= newest - window_s * 1000:
            recent.update(range(d.record.seq, d.record.end + 1))
    return len(recent)


# --- the consumer's view -------------------------------------------------------------------------


def consumer_view(deliveries: Iterable[Delivery]) -> dict[str, dict[int, Record]]:
    """Per connection, per seq: the record a consumer following the contract keeps
    (the highest fence; at one fence, the last delivered). A marker is kept at its seq."""
    out: dict[str, dict[int, Record]] = {}
    for d in sorted(deliveries, key=lambda d: d.position):
        r = d.record
        if r is None:
            continue
        mine = out.setdefault(r.connection_id, {})
        kept = mine.get(r.seq)
        if kept is None or not records.newer(kept, r):
            mine[r.seq] = r
    return out


def as_items(view: Mapping[int, Record]) -> list[dict[str, Any]]:
    """One connection's view as messages table items (what the table would hold), in seq order."""
    out = []
    for seq, r in sorted(view.items()):
        item: dict[str, Any] = {schema.MSG_SK: seq, schema.MSG_FENCE_TOKEN: r.fence_token,
                                schema.MSG_WORKER_ID: r.worker_id, schema.RECEIVED_AT_MS: r.received_at_ms}
        if r.is_marker:
            item[schema.SKIPPED] = r.skipped
            if r.skip_to is not None:
                item[schema.SKIP_TO] = r.skip_to
        elif r.data_ref is not None:
            item.update({schema.DATA_REF: r.data_ref, schema.DATA_BYTES: r.data_bytes, schema.DATA_SHA256: r.data_sha256})
        elif r.data_base64 is not None:  # a binary feed's: as the table keeps it
            item.update({schema.MESSAGE_DATA: json.dumps(r.data_base64), schema.DATA_FORMAT: schema.DATA_FORMAT_BINARY})
        else:
            item[schema.MESSAGE_DATA] = json.dumps(r.data, separators=(",", ":"), ensure_ascii=False)
        if r.data_bytes is not None:
            item.setdefault(schema.DATA_BYTES, r.data_bytes)
        out.append(item)
    return out
