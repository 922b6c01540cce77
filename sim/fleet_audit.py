"""The fleet's reads of what it stored, after (or during) a run: the messages as a user
or a consumer reads them, the large frame read back whole, the table audit and, where
the sink has kinesis, the stream and its audit (:mod:`.stream_audit`), where it has
firehose, the delivery stream's objects and theirs (:mod:`.delivery_audit`).

A part of :class:`~sim.fleet.Fleet` (its base class), kept apart from the
processes and the observer: it reads only what the fleet set up (``aws_env``, the
harness's clients, the upstream's books) and never changes anything.
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from typing import Any, Callable, Sequence

from wsfleet import settings_spec
from wsfleet import schema
from . import delivery_audit, stream_audit
from .emulator import journal
from .observed import Audit, LargeFrame


class FleetAudit:
    """The reads; :class:`~sim.fleet.Fleet` provides what they use."""

    # Set up by Fleet.start.
    aws_env: dict[str, str]
    sinks: tuple[str, ...]
    upstream: Any
    emulator: Any
    timing: Any
    messages_store: Any
    objects_store: Any
    _ddb: Any
    _kinesis: Any
    _firehose: Any
    _s3: Any
    _delivery_bodies: dict[str, bytes]  # the delivery stream's objects read so far, by key
    # And Fleet's scan() (the connections as read now) and request() (the local API).

    def messages(self, connection_id: str) -> list[dict]:
        """The connection's messages as table items: the table's, or with no table sink
        what a consumer keeps of the stream or the delivery stream
        (:func:`stream_audit.consumer_view`)."""
        if schema.SINK_DYNAMODB in self.sinks:
            return self.messages_store.read_all(connection_id)
        return stream_audit.as_items(stream_audit.consumer_view(self.read_deliveries()).get(connection_id, {}))

    def read_deliveries(self) -> list[stream_audit.Delivery]:
        """What a reader of a sink other than the table reads: the stream where there is
        one, else the delivery stream's objects."""
        return self.read_stream() if schema.SINK_KINESIS in self.sinks else self.read_delivery()

    # -- the delivery stream (SINK has firehose) ----------------------------------------------

    def read_delivery(self) -> list[stream_audit.Delivery]:
        """Every line the delivery stream has put in S3 now, in a reader's order (each
        object read once: the audits read the whole delivery again and again)."""
        return delivery_audit.read_delivery(
            self._firehose, self._s3, self.aws_env[settings_spec.MESSAGES_DELIVERY_STREAM_NAME], self._delivery_bodies
        )

    def delivery_audit(self, connection_ids: Sequence[str], *, data_of: Sequence[str] | None = None,
                       deliveries: Sequence[stream_audit.Delivery] | None = None) -> stream_audit.StreamAudit:
        """The delivery stream's lines against the same rules as the stream's
        (:mod:`.delivery_audit`)."""
        result = self.stream_audit(connection_ids, data_of=data_of,
                                   deliveries=self.read_delivery() if deliveries is None else deliveries)
        result.carriers = "lines in S3 objects"
        return result

    # -- the messages stream (SINK has kinesis) ---------------------------------------------

    def read_stream(self) -> list[stream_audit.Delivery]:
        """Every record on the messages stream now, shard by shard."""
        return stream_audit.read_stream(self._kinesis, self.aws_env[settings_spec.MESSAGES_STREAM_NAME])

    def _journal(self) -> list[dict]:
        """This fleet's entries of the emulator's journal (another fleet may share it)."""
        tables = (self.aws_env["TABLE_NAME"], self.aws_env["SESSIONS_TABLE_NAME"])
        return [e for e in journal(self.emulator.endpoint_url) if e.get("table") in tables]

    @property
    def again_window_s(self) -> float:
        """How far back a takeover may deliver frames again: CHECKPOINT_SECONDS, plus the
        takeover (a crashed owner's last checkpoint is at most that old when it dies, and
        its successor resumes from it)."""
        return self.timing.checkpoint_s + self.timing.crash_bound_s

    def stream_audit(
        self, connection_ids: Sequence[str], *, data_of: Sequence[str] | None = None,
        deliveries: Sequence[stream_audit.Delivery] | None = None,
        excuse: Callable[[stream_audit.Delivery], bool] | None = None,
    ) -> stream_audit.StreamAudit:
        """The stream against the at-least-once rule, each connection's final checkpoint
        and the journal's acquisitions; the data of ``data_of`` (default: every one)
        against what the upstream sent."""
        assert self.upstream is not None
        states = self.scan()
        read = self.read_stream() if deliveries is None else deliveries
        expected = {cid: self.upstream.expected_data(cid) for cid in (connection_ids if data_of is None else data_of)}
        return stream_audit.audit(
            read, stream_audit.acquisitions(self._journal()), window_s=self.again_window_s,
            checkpoints={cid: states[cid].last_seq for cid in connection_ids if cid in states},
            check=stream_audit.expected_data(expected), excuse=excuse,
        )

    def large_frame(self, connection_id: str, seq: int) -> LargeFrame:
        """Read one seq back as a user does, through the read API (GET
        /connections/{id}/messages, then the entry's presigned data_url), against the
        upstream's book of what it sent and what the item says. With no table sink, as
        a consumer of the stream does: the record it keeps, then the object it names."""
        assert self.upstream is not None
        sent = json.dumps(json.loads(self.upstream.frames(connection_id)[seq])["data"], separators=(",", ":"), ensure_ascii=False)
        sent_bytes = sent.encode("utf-8")
        out = LargeFrame(connection_id, seq, len(sent_bytes), hashlib.sha256(sent_bytes).hexdigest(), stored="absent")
        if schema.SINK_DYNAMODB not in self.sinks:
            return self._large_frame_from_stream(out)
        status, page = self.request("GET", f"/connections/{connection_id}/messages?after_seq={seq - 1}&limit=1")
        entry = next((e for e in page.get("messages", []) if e.get("seq") == seq), None) if status == 200 else None
        if entry is None:
            return out
        if "data_url" not in entry:
            out.stored = "marker" if "skipped" in entry else "inline"
            return out
        with urllib.request.urlopen(entry["data_url"], timeout=30) as resp:
            body = resp.read()
        # Its item: the first after seq - 1 (one Query of one item, not the whole partition).
        item = next(self.messages_store.read_after(connection_id, seq - 1, batch=1), {})
        if item.get(schema.MSG_SK) != seq:
            item = {}
        out.stored, out.data_ref = "object", item.get(schema.DATA_REF)
        out.item_bytes, out.item_sha256 = entry.get("data_bytes"), entry.get("data_sha256")
        out.read_bytes, out.read_sha256 = len(body), hashlib.sha256(body).hexdigest()
        return out

    def _large_frame_from_stream(self, out: LargeFrame) -> LargeFrame:
        record = stream_audit.consumer_view(self.read_deliveries()).get(out.connection_id, {}).get(out.seq)
        out.via = "stream" if schema.SINK_KINESIS in self.sinks else "firehose"
        if record is None:
            return out
        if record.data_ref is None:
            out.stored = "marker" if record.is_marker else "inline"
            return out
        body = self.objects_store.get(record.data_ref)
        out.stored, out.data_ref = "object", record.data_ref
        out.item_bytes, out.item_sha256 = record.data_bytes, record.data_sha256
        out.read_bytes, out.read_sha256 = len(body), hashlib.sha256(body).hexdigest()
        return out

    def _stored_seqs(self, connection_id: str) -> list[int]:
        """Every seq stored for a connection, ascending (seq is the sort key): one
        keys-only query, paginated. moto answers a query in time that grows with the
        whole table, so one query per connection rather than three (count, lowest,
        highest) keeps the final audit of a long run short."""
        kwargs: dict[str, Any] = {
            "TableName": self.aws_env["MESSAGES_TABLE_NAME"],
            "KeyConditionExpression": "#p = :p",
            "ExpressionAttributeNames": {"#p": schema.MSG_PK, "#s": schema.MSG_SK},
            "ExpressionAttributeValues": {":p": {"S": schema.connection_pk(connection_id)}},
            "ProjectionExpression": "#s",
            "ConsistentRead": True,
        }
        seqs: list[int] = []
        while True:
            resp = self._ddb.query(**kwargs)
            seqs.extend(int(item[schema.MSG_SK]["N"]) for item in resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                return seqs
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def audit(self, connection_ids: list[str] | set[str] | None = None) -> list[Audit]:
        """Each connection's stored seqs against its checkpoint and the upstream's books
        (with no table sink, the seqs a consumer of the stream keeps)."""
        assert self.upstream is not None
        states = self.scan()
        view = None if schema.SINK_DYNAMODB in self.sinks else stream_audit.consumer_view(self.read_deliveries())
        out = []
        for cid in sorted(connection_ids if connection_ids is not None else states):
            seqs = self._stored_seqs(cid) if view is None else sorted(view.get(cid, {}))
            first, last = (seqs[0], seqs[-1]) if seqs else (None, None)
            present = set(seqs)
            missing = [s for s in range(1, (last or 0) + 1) if s not in present]
            delivered: set[int] = set()
            for record in self.upstream.sockets(cid):
                if record.first_seq_sent is not None:
                    delivered.update(range(record.first_seq_sent, record.last_seq_sent + 1))
            out.append(
                Audit(
                    connection_id=cid,
                    rows=len(seqs),
                    first=first,
                    last=last,
                    checkpoint=states[cid].last_seq if cid in states else 0,
                    produced=self.upstream.produced(cid),
                    delivered=len(delivered),
                    missing=missing,
                )
            )
        return out
