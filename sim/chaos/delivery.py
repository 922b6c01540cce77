"""The messages stream (``SINK`` with kinesis) as the checker judges it: the stream
audit (:mod:`sim.stream_audit`) over the run's stream, the journal's
acquisitions and checkpoints and the connections' final checkpoints, its findings as
violations. Pure functions, no I/O.

* ``lost``: a seq between a connection's first and last delivery, or up to its last
  checkpoint, never delivered (a skip marker covers its range);
* ``order``: the last delivery of a seq before the last delivery of a lower one, or one
  connection's records on two shards (nothing orders them then);
* ``duplicate``: a seq delivered again with a higher fence at or below the checkpoint
  that fence was acquired with (or by a fence the journal never saw acquired), or more
  seqs again after a takeover than the previous owners received in CHECKPOINT_SECONDS
  plus the takeover bound before their last frame;
* ``stale_fence``: a record with a fence below one already on the stream, unless its
  writer was frozen with the request past its last deadline check (``excuse``);
* ``corrupt``: a record that is not a wsfleet record. The data itself is judged on what
  a consumer keeps (:func:`sim.stream_audit.consumer_view`) by :mod:`.data`,
  as the table's rows are.

Deliveries again with the same fence (a partly refused or unanswered PutRecords sent
again) are counted, not judged: the ordering rule above is what they must keep.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

from wsfleet import metrics_names as names
from wsfleet import schema
from ..timing import Timing
from ..stream_audit import Delivery, acquisitions, as_items, audit, consumer_view
from .data import check_data
from .evidence import Evidence, Row
from .history import Op

AS_VIOLATION = {
    "gap": "lost", "order": "order", "shards": "order", "duplicate": "duplicate", "bound": "duplicate",
    "stale": "stale_fence", "bad_record": "corrupt", "data": "corrupt",
}


def window_s(timing: Timing) -> float:
    """How far back a takeover may deliver again: CHECKPOINT_SECONDS and the takeover."""
    return timing.checkpoint_s + timing.crash_bound_s


def check_stream(
    ev: Evidence, ops: Sequence[Op], timing: Timing, totals: dict[str, int],
    expected: Mapping[tuple[str, int], str], excuse: Callable[[Delivery], bool],
) -> list[tuple[str, str, str]]:
    """(violation kind, connection, detail) for the stream; its counts into ``totals``."""
    assert ev.stream is not None
    result = audit(ev.stream, acquisitions(ev.journal), window_s=window_s(timing),
                   checkpoints=ev.checkpoints, excuse=excuse)
    out = [(AS_VIOLATION[f.kind], f.connection_id, f.sentence) for f in result.findings]
    worst = result.worst
    totals.update({
        "stream_records": result.records, "stream_kinesis_records": result.kinesis_records,
        "stream_resent": result.resent,
        "stream_again_after_takeover": result.again_after_takeover,
        "stream_takeovers_again": sum(1 for t in result.takeovers if t.again),
        "stream_most_again": worst.again if worst else 0, "stream_most_again_bound": worst.bound if worst else 0,
        "stream_stale_excused": result.stale_excused,
    })
    if schema.SINK_DYNAMODB in ev.sinks:
        # The rows judged so far were the table's: judge what a consumer keeps of the stream too.
        view = consumer_view(ev.stream)
        kept = dataclasses.replace(ev, rows={cid: _rows(as_items(view.get(cid, {}))) for cid in ev.connections})
        scratch = {"stored": 0, "produced": 0}
        for cid in ev.connections:
            out += [(kind, cid, f"on the stream: {detail}") for kind, detail in check_data(cid, kept, ops, timing, scratch, expected)]
    return out


def resent_note(ev: Evidence, totals: Mapping[str, int]) -> str:
    """The workers' RecordsResent (their last ``stats`` or ``shutdown_complete`` line
    each) beside the stream's deliveries again at one fence: a cross-check, not evidence."""
    counted = 0
    for events in ev.logs.values():
        last = next((e for e in reversed(events) if names.RECORDS_RESENT in e), None)
        counted += int(last[names.RECORDS_RESENT]) if last is not None else 0
    return (f"workers counted {counted} records sent again after a partial failure (RecordsResent: the refused ones, "
            f"on the stream once, among them; a killed worker's since its last stats line are missing); the stream "
            f"holds {totals.get('stream_resent', 0)} deliveries again at one fence (accepted records sent again behind "
            "a refused one, and whole PutRecords sent again after an answer was lost)")


def _rows(items: Sequence[Mapping]) -> list[Row]:
    return [
        Row(seq=int(i[schema.MSG_SK]), fence=int(i.get(schema.MSG_FENCE_TOKEN, 0)), worker=i.get(schema.MSG_WORKER_ID, ""),
            received_at_ms=int(i.get(schema.RECEIVED_AT_MS, 0)), data=i.get(schema.MESSAGE_DATA, ""),
            skipped=i.get(schema.SKIPPED, ""))
        for i in items
    ]
