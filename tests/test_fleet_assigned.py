"""Feeds with no seq on the fleet as real processes (upstream ``seq: assigned``): a text
feed, a binary feed and a seq-less JSON feed, whose upstream cannot replay. Their owner
is killed with SIGKILL; at the end the read API (``SINK=dynamodb``) or the messages
stream (``SINK=kinesis``, every record read, each seq's records of every fence
compared) gives back every stored frame exactly as the upstream sent it (checked
against the upstream's books, not the workers' claims), in the order it was sent, none
twice, no seq with two frames, and each feed whose owner died holds one ``reconnect``
marker, the others none."""

from __future__ import annotations

import base64
import json

import pytest

from sim.fleet import Fleet
from sim.processes import eventually
from sim.timing import Timing
from wsfleet import schema
from wsfleet.worker.numbering import RESERVE_BLOCK

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TIMING = Timing(lease_s=3.0, heartbeat_s=0.75, reconcile_s=1.0, skew_ms=200, flush_ms=200, shutdown_s=5.0, checkpoint_s=3.0)
RATE = 5.0  # frames per second per stream
# connection id -> (URL query of the local upstream, upstream object, the upstream's frame shape)
FEEDS = {
    "a-text": ("replay=none", {"format": "text", "seq": "assigned"}, "default"),
    "a-binary": ("replay=none&format=binary", {"format": "binary", "seq": "assigned"}, "default"),
    "a-json": ("replay=none&shape=flat", {"seq": "assigned"}, "flat"),
}


@pytest.fixture(params=[schema.SINK_DYNAMODB, schema.SINK_KINESIS])
def fleet(request, emulator, tmp_path):
    with Fleet(run_dir=tmp_path, timing=TIMING, rate=RATE, emulator=emulator, sample_interval=None, sink=request.param) as f:
        yield f


def entries(fleet: Fleet, cid: str) -> list[dict]:
    """What is stored for ``cid`` as read API entries, in seq order."""
    return read_api(fleet, cid) if schema.SINK_DYNAMODB in fleet.sinks else from_stream(fleet, cid)


def from_stream(fleet: Fleet, cid: str) -> list[dict]:
    """The stream's records of ``cid`` as entries; every record of a seq, whatever its
    fence, must say the same (a takeover's records again are the same frames)."""
    by_seq: dict[int, set[str]] = {}
    for d in fleet.read_stream():
        r = d.record
        if r is not None and r.connection_id == cid:
            by_seq.setdefault(r.seq, set()).add(json.dumps({"seq": r.seq, **r.delivered()}))
    assert all(len(found) == 1 for found in by_seq.values()), (cid, {s: f for s, f in by_seq.items() if len(f) > 1})
    return [json.loads(next(iter(by_seq[s]))) for s in sorted(by_seq)]


def read_api(fleet: Fleet, cid: str) -> list[dict]:
    """Every entry of the read API, page after page."""
    out: list[dict] = []
    after = -1
    while True:
        status, body = fleet.request("GET", f"/connections/{cid}/messages?after_seq={after}&limit=1000")
        assert status == 200, body
        out += body["messages"]
        if body["next_after_seq"] is None:
            return out
        after = body["next_after_seq"]


def as_sent(cid: str, entry: dict) -> bytes:
    """The frame an entry says the upstream sent, as the upstream's bytes."""
    if cid == "a-binary":
        return base64.b64decode(entry["data_base64"])
    if cid == "a-text":
        return entry["data"].encode()
    return json.dumps(entry["data"], separators=(",", ":")).encode()


def stored_past_checkpoint(fleet: Fleet, ids: set[str], *, by: int) -> bool:
    states = fleet.scan()
    return all(max((e["seq"] for e in entries(fleet, c)), default=0) >= states[c].last_seq + by for c in ids)


def stored_count(fleet: Fleet, cid: str) -> int:
    return len([e for e in entries(fleet, cid) if "skipped" not in e])


def test_text_binary_and_seqless_json_feeds_read_back_exactly_and_a_kill_9_leaves_one_reconnect_marker(fleet):
    for name in ("w1", "w2"):
        fleet.start_worker(name, wait=False)
    for name in ("w1", "w2"):
        fleet.wait_started(name)
    for cid, (query, upstream, shape) in FEEDS.items():
        assert fleet.start_connection(cid, f"{fleet.ws_url(cid)}?{query}", upstream=upstream, shape=shape) == 202
    fleet.wait_connected(list(FEEDS), timeout=30)
    eventually(lambda: all(stored_count(fleet, c) >= 3 for c in FEEDS), 30, "a few frames of each", interval=0.25)

    owners = fleet.sample().owners()
    victim = owners["a-text"]
    killed = {c for c in FEEDS if owners.get(c) == victim}
    # Killed with frames stored past the checkpoint (checkpoints are 3 s apart): a new
    # owner that numbered from the checkpoint would give their seqs to other frames.
    eventually(lambda: stored_past_checkpoint(fleet, killed, by=3), 15, "frames past the checkpoint", interval=0.2)
    before = {c: stored_count(fleet, c) for c in FEEDS}
    fleet.kill(victim)
    fleet.start_worker("w3", wait=False)
    eventually(
        lambda: all(fleet.sample().owners().get(c) not in ("", victim) for c in FEEDS),
        TIMING.crash_bound_s + 15,
        "every feed held by a live worker",
        interval=0.25,
    )
    eventually(lambda: all(stored_count(fleet, c) >= before[c] + 3 for c in FEEDS), 30, "storing again", interval=0.25)
    for cid in FEEDS:
        assert fleet.stop_connection(cid) == 202
    fleet.wait_quiet(list(FEEDS), timeout=TIMING.stop_bound_s + TIMING.lease_s + 10)

    for cid in FEEDS:
        got = entries(fleet, cid)
        seqs = [e["seq"] for e in got]
        assert seqs == sorted(set(seqs)) and seqs[0] == 1, (cid, seqs)
        markers = [e for e in got if "skipped" in e]
        assert [m["skipped"] for m in markers] == ["reconnect"] * (cid in killed), (cid, markers)
        # Seqs follow one another but where a crashed owner's reservation was left unused.
        jumps = [b - a for a, b in zip(seqs, seqs[1:], strict=False) if b != a + 1]
        assert len(jumps) <= len(markers) and all(j <= RESERVE_BLOCK for j in jumps), (cid, seqs)
        # Every frame exactly as the upstream sent it, in its order, none twice.
        books = fleet.upstream.frames(cid)
        by_frame = {frame: seq for seq, frame in books.items()}
        upstream_seqs = [by_frame.get(as_sent(cid, e)) for e in got if "skipped" not in e]
        assert None not in upstream_seqs, cid
        assert upstream_seqs == sorted(set(upstream_seqs)), (cid, upstream_seqs)
