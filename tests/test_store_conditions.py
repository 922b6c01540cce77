"""The lease tables' named conditions (store.conditions), without AWS: each names only
attributes the adapter knows, and the item readings mirror their expressions."""

from __future__ import annotations

import re

import pytest

from wsfleet import schema
from wsfleet.store import conditions as cond
from wsfleet.store.base import _PLACEHOLDERS

NAMED = {name: value for name, value in vars(cond).items() if name.isupper() and isinstance(value, str)}


@pytest.mark.parametrize("name", sorted(NAMED))
def test_every_named_condition_uses_only_attributes_the_adapter_names(name):
    used = set(re.findall(r"#[a-z]+", NAMED[name]))
    assert used and used <= set(_PLACEHOLDERS), used - set(_PLACEHOLDERS)


def test_an_acquire_is_pinned_to_the_upstream_read_or_its_absence_and_to_a_release_mark():
    plain = cond.acquire_pinned({}, released=False)
    assert "attribute_not_exists(#up)" in plain and "#rf" not in plain
    pinned = cond.acquire_pinned({schema.UPSTREAM: {"format": "text"}}, released=True)
    assert "#up = :up" in pinned and "#rf = :fence" in pinned and "#l = :holder" in pinned


def test_holding_read_from_an_item_needs_its_session_and_fence_and_no_release_mark():
    item = {schema.LEASE_SESSION: "a#1", schema.FENCE_TOKEN: 3}
    assert cond.holds(item, "a#1", 3)
    assert not cond.holds(item, "a#1", 2) and not cond.holds(item, "b#1", 3) and not cond.holds(None, "a#1", 3)
    assert not cond.holds({**item, schema.RELEASED_FENCE: 3}, "a#1", 3)


def test_a_checkpoint_is_behind_only_when_the_stored_one_is_past_it():
    assert cond.checkpoint_behind({schema.LAST_SEQ: 9}, 7)
    assert not cond.checkpoint_behind({schema.LAST_SEQ: 9}, 9)  # the same again: a retry, written
    assert not cond.checkpoint_behind({}, 0) and not cond.checkpoint_behind(None, 0)
