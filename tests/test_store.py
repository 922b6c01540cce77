"""The DynamoDB adapter against the emulator: lease acquisition, renewal, release,
the orphan index, and message writes."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config

from wsfleet import schema
from wsfleet.leases import AcquireFailure, RenewFailure
from wsfleet.store import Acquired, ConnectionsStore, MessagesStore, NotAcquired, TransientError
from wsfleet.stream import Frame

LEASE = dict(lease_ms=20_000, max_clock_skew_ms=1_000)


@pytest.fixture
def store(ddb, aws_env):
    return ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4)


@pytest.fixture
def started(store):
    store.start("c1", "ws://127.0.0.1:9/s")
    return "c1"


def test_twenty_racing_workers_produce_exactly_one_winner(emulator, aws_env, started):
    # Each racer has its own client (own connection pool), as separate workers would.
    def racer(i: int):
        client = boto3.client("dynamodb", endpoint_url=emulator.endpoint_url, region_name="us-east-1")
        s = ConnectionsStore(client, aws_env["TABLE_NAME"], state_shards=4)
        barrier.wait()
        return s.acquire(started, owner=f"w{i}", **LEASE)

    barrier = threading.Barrier(20)
    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(racer, range(20)))
    winners = [r for r in results if isinstance(r, Acquired)]
    assert len(winners) == 1
    assert all(r.reason is AcquireFailure.HELD for r in results if not isinstance(r, Acquired))
    item = ConnectionsStore(
        boto3.client("dynamodb", endpoint_url=emulator.endpoint_url, region_name="us-east-1"),
        aws_env["TABLE_NAME"],
        state_shards=4,
    ).get(started)
    assert item["fence_token"] == 1
    assert item["lease_owner"] == winners[0].item["lease_owner"]


def test_acquire_sets_owner_and_expiry_and_bumps_the_fence(store, started):
    before = int(time.time() * 1000)
    won = store.acquire(started, owner="a", **LEASE)
    assert isinstance(won, Acquired)
    assert won.item["lease_owner"] == "a" and won.item["fence_token"] == 1
    assert before + 20_000 <= won.item["lease_expires_at_ms"] <= int(time.time() * 1000) + 20_000


def test_a_live_lease_cannot_be_taken(store, started):
    won = store.acquire(started, owner="a", **LEASE)
    lost = store.acquire(started, owner="b", **LEASE)
    assert lost == NotAcquired(AcquireFailure.HELD, won.item["lease_expires_at_ms"])


def test_an_expired_lease_is_taken_over_and_the_fence_increments(store, started):
    store.acquire(started, owner="a", lease_ms=1, max_clock_skew_ms=0)
    time.sleep(0.01)  # let the 1 ms lease run out
    won = store.acquire(started, owner="b", lease_ms=20_000, max_clock_skew_ms=0)
    assert isinstance(won, Acquired) and won.item["fence_token"] == 2 and won.item["lease_owner"] == "b"


def test_an_expired_lease_is_not_taken_within_the_skew_margin(store, started):
    store.acquire(started, owner="a", lease_ms=1, max_clock_skew_ms=0)
    assert store.acquire(started, owner="b", lease_ms=20_000, max_clock_skew_ms=60_000).reason is AcquireFailure.HELD


def test_acquire_of_unknown_or_stopped_connection_says_why(store, started):
    assert store.acquire("nope", owner="a", **LEASE) == NotAcquired(AcquireFailure.NOT_FOUND)
    store.stop(started)
    assert store.acquire(started, owner="a", **LEASE).reason is AcquireFailure.STOPPED


def test_a_retried_acquire_that_already_landed_counts_as_won(store, started):
    first = store.acquire(started, owner="a", **LEASE)
    again = store.acquire(started, owner="a", **LEASE)
    assert isinstance(again, Acquired) and again.item["fence_token"] == first.item["fence_token"] == 1


def test_renew_extends_the_lease_and_stores_the_checkpoint(store, started):
    won = store.acquire(started, owner="a", **LEASE)
    renewed = store.renew(started, owner="a", fence_token=1, lease_ms=20_000, last_seq=42)
    assert renewed["last_seq"] == 42
    assert renewed["lease_expires_at_ms"] >= won.item["lease_expires_at_ms"]


def test_renew_after_a_takeover_fails_and_says_lost(store, started):
    store.acquire(started, owner="a", lease_ms=1, max_clock_skew_ms=0)
    time.sleep(0.01)
    store.acquire(started, owner="b", lease_ms=20_000, max_clock_skew_ms=0)
    assert store.renew(started, owner="a", fence_token=1, lease_ms=20_000, last_seq=9) is RenewFailure.LOST
    assert store.get(started)["last_seq"] == 0  # the stale owner's checkpoint did not land


def test_renew_after_stop_says_stopped_and_after_delete_says_deleted(store, ddb, aws_env, started):
    store.acquire(started, owner="a", **LEASE)
    store.stop(started)
    assert store.renew(started, owner="a", fence_token=1, lease_ms=20_000, last_seq=1) is RenewFailure.STOPPED
    ddb.delete_item(TableName=aws_env["TABLE_NAME"], Key={"pk": {"S": schema.connection_pk(started)}})
    assert store.renew(started, owner="a", fence_token=1, lease_ms=20_000, last_seq=1) is RenewFailure.DELETED


def test_release_frees_the_lease_with_a_final_checkpoint_only_for_the_owner(store, started):
    store.acquire(started, owner="a", **LEASE)
    assert store.release(started, owner="b", fence_token=1, last_seq=99) is False
    assert store.get(started)["lease_owner"] == "a"
    assert store.release(started, owner="a", fence_token=1, last_seq=7) is True
    item = store.get(started)
    assert (item["lease_owner"], item["lease_expires_at_ms"], item["last_seq"], item["fence_token"]) == ("", 0, 7, 1)
    # A retry of the release that already landed is still a success.
    assert store.release(started, owner="a", fence_token=1, last_seq=7) is True


def test_a_released_lease_is_immediately_acquirable(store, started):
    store.acquire(started, owner="a", **LEASE)
    store.release(started, owner="a", fence_token=1, last_seq=3)
    won = store.acquire(started, owner="b", **LEASE)
    assert isinstance(won, Acquired) and won.item["fence_token"] == 2 and won.item["last_seq"] == 3


def test_the_orphan_index_lists_only_started_connections_below_the_bound(store):
    for cid in ("a", "b", "c"):
        store.start(cid, "ws://h/x")
    store.acquire("a", owner="w", **LEASE)  # live: expiry in 20 s
    store.stop("c")  # leaves the sparse index
    now = int(time.time() * 1000)
    found = {c.connection_id for shard in range(4) for c in store.suspects(shard, below_ms=now)}
    assert found == {"b"}
    found_all = {c.connection_id for shard in range(4) for c in store.suspects(shard, below_ms=now + 60_000)}
    assert found_all == {"a", "b"}


def test_the_orphan_query_follows_pagination(store):
    ids = [f"p{i}" for i in range(12)]
    for cid in ids:
        store.start(cid, "ws://h/x")
    found = [c.connection_id for shard in range(4) for c in store.suspects(shard, below_ms=1, limit=2)]
    assert sorted(found) == sorted(ids)


def _throttling(left: dict):
    """A before-send hook that answers requests with a throttle while ``left["n"] > 0``."""

    class Raw:
        def stream(self, **_):
            yield b'{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"slow down"}'

    def hook(request, **_):
        if left["n"] > 0:
            left["n"] -= 1
            return AWSResponse(request.url, 400, {"x-amzn-RequestId": "t"}, Raw())
        return None

    return hook


def test_throttled_renewals_raise_transient_error_and_do_not_drop_the_lease(emulator, aws_env, store, started):
    client = boto3.client(
        "dynamodb",
        endpoint_url=emulator.endpoint_url,
        region_name="us-east-1",
        config=Config(retries={"mode": "standard", "max_attempts": 2}),
    )
    throttled = ConnectionsStore(client, aws_env["TABLE_NAME"], state_shards=4)
    store.acquire(started, owner="a", **LEASE)
    left = {"n": 100}
    client.meta.events.register("before-send.dynamodb.UpdateItem", _throttling(left))
    with pytest.raises(TransientError):
        throttled.renew(started, owner="a", fence_token=1, lease_ms=20_000, last_seq=5)
    assert left["n"] < 100  # the throttles were really served
    assert store.get(started)["lease_owner"] == "a"
    left["n"] = 0
    renewed = throttled.renew(started, owner="a", fence_token=1, lease_ms=20_000, last_seq=5)
    assert renewed["last_seq"] == 5


def test_start_never_resets_a_live_lease(store, started):
    store.acquire(started, owner="a", **LEASE)
    store.renew(started, owner="a", fence_token=1, lease_ms=20_000, last_seq=11)
    before = store.get(started)
    store.start(started, "ws://127.0.0.1:9/s")
    assert store.get(started) == before


def test_messages_are_keyed_by_seq_so_a_replay_rewrites_not_duplicates(ddb, aws_env):
    msgs = MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"], ttl_days=1)
    frames = [Frame(seq, f'{{"v":{seq}}}', 1_000_000) for seq in range(1, 61)]
    msgs.put("c1", frames, fence_token=1, worker_id="a")
    msgs.put("c1", frames[40:], fence_token=2, worker_id="b")  # replay after a takeover
    rows = msgs.read_all("c1")
    assert [r["sk"] for r in rows] == list(range(1, 61))
    assert rows[0]["message_data"] == '{"v":1}' and rows[0]["worker_id"] == "a"
    assert rows[-1]["fence_token"] == 2 and rows[-1]["expires_at"] == 1_000 + 86_400
