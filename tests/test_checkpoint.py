"""The Checkpoint value: the highest seq stored gap-free, which only moves forward."""

import pytest

from wsfleet.checkpoint import Checkpoint
from wsfleet.stream import SeqTracker


def test_a_checkpoint_advances_to_a_higher_seq_and_stays_put_for_a_lower_or_equal_one():
    c = Checkpoint(10)
    assert c.advanced(12) == 12 and isinstance(c.advanced(12), Checkpoint)
    assert c.advanced(9) is c and c.advanced(10) is c  # a stale report: nothing new is stored
    assert c == 10  # a value: advancing returns another, never changes this one


def test_a_checkpoint_is_the_seq_it_stands_for_when_written_or_logged():
    c = Checkpoint(7)
    assert (int(c), str(c), f"{c}", c + 1) == (7, "7", "7", 8)
    assert Checkpoint() == 0


def test_a_checkpoint_below_zero_is_refused():
    with pytest.raises(ValueError):
        Checkpoint(-1)


def test_the_trackers_checkpoint_never_goes_back_whatever_it_hears():
    t = SeqTracker(checkpoint=5)
    t.stored(7)
    t.stored(6)  # a stale report
    assert t.checkpoint == 7 and isinstance(t.checkpoint, Checkpoint)
