"""An assigned-seq feed's reservation (``seq_reserved``) in the connections table, on the
emulator: written only by the owning session at its fence, and what a new owner after a
crash reads to number past it."""

from __future__ import annotations

from wsfleet import schema
from tests.test_store import clock, started, store  # noqa: F401 - fixtures


def test_only_the_owning_session_at_its_fence_reserves(store, started):  # noqa: F811
    store.acquire(started, session_id="a#1", worker_id="a")
    assert store.reserve_seqs(started, session_id="a#1", fence_token=1, upto=100)
    assert store.reserve_seqs(started, session_id="a#1", fence_token=1, upto=100)  # a retry of one that landed
    assert not store.reserve_seqs(started, session_id="b#1", fence_token=1, upto=500)
    assert not store.reserve_seqs(started, session_id="a#1", fence_token=2, upto=500)
    assert store.get(started)[schema.SEQ_RESERVED] == 100


def test_a_new_owner_after_a_crash_reads_the_reservation_and_the_old_owner_can_reserve_no_more(store, started):  # noqa: F811
    store.acquire(started, session_id="a#1", worker_id="a")
    store.reserve_seqs(started, session_id="a#1", fence_token=1, upto=200)
    assert store.free_orphan(started, dead_session="a#1")

    taken = store.acquire(started, session_id="b#1", worker_id="b")

    assert not taken.checkpoint_is_end and int(taken.item[schema.SEQ_RESERVED]) == 200
    assert not store.reserve_seqs(started, session_id="a#1", fence_token=1, upto=300)
    assert store.reserve_seqs(started, session_id="b#1", fence_token=2, upto=300)
