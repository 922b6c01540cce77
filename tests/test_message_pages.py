"""The read API's pages without AWS: query checks, item-to-entry shapes, the cut by count
and by the bytes Lambda counts."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from wsfleet import schema
from wsfleet.message_pages import (
    DEFAULT_LIMIT,
    FIRST_AFTER_SEQ,
    MAX_PAGE_BYTES,
    PageRequest,
    build_page,
    entry,
    entry_text,
    page_request,
    page_text,
    payload_bytes,
)
from wsfleet.router import response
from wsfleet.validation import Invalid


def presign(bucket: str, key: str) -> str:
    return f"https://{bucket}.example/{key}?signed"


def inline(seq: int, data: object) -> dict:
    return {schema.MSG_SK: seq, schema.MESSAGE_DATA: json.dumps(data, separators=(",", ":"), ensure_ascii=False)}


def test_no_query_is_a_page_of_100_from_before_seq_0():
    assert page_request(None) == page_request({}) == PageRequest(FIRST_AFTER_SEQ, DEFAULT_LIMIT) == PageRequest(-1, 100)
    assert page_request({"after_seq": "007", "limit": "1000"}) == PageRequest(7, 1000)


@pytest.mark.parametrize("query", [{"after_seq": "1e3"}, {"after_seq": "0x10"}, {"limit": "1.0"}, {"x": "1"}])
def test_anything_else_is_invalid_with_a_sentence(query):
    with pytest.raises(Invalid) as raised:
        page_request(query)
    assert raised.value.message.endswith(".") and next(iter(query)) in raised.value.message


def test_junk_from_a_direct_invocation_is_invalid_not_a_crash():
    for query, multi in (("after_seq=1", None), ({"limit": 5}, None), ({}, ["x"]), ({"x" * 10_000: "1"}, None)):
        with pytest.raises(Invalid) as raised:
            page_request(query, multi)
        assert len(raised.value.message) < 200


def test_entries_have_the_contract_shapes():
    assert entry(inline(4, {"a": [1, "é"]}), presign) == {"seq": 4, "data": {"a": [1, "é"]}}
    ref = {
        schema.MSG_SK: 5,
        schema.DATA_REF: "s3://bkt/messages/c1/00000000000000000005",
        schema.DATA_BYTES: 500_000,
        schema.DATA_SHA256: "ab" * 32,
    }
    assert entry(ref, presign) == {
        "seq": 5,
        "data_url": "https://bkt.example/messages/c1/00000000000000000005?signed",
        "data_bytes": 500_000,
        "data_sha256": "ab" * 32,
    }
    gap = {schema.MSG_SK: 6, schema.SKIPPED: schema.SKIPPED_UPSTREAM_GAP, schema.SKIP_TO: 9}
    assert entry(gap, presign) == {"seq": 6, "skipped": "upstream_gap", "to_seq": 9}
    big = {schema.MSG_SK: 10, schema.SKIPPED: schema.SKIPPED_OVER_FRAME_LIMIT, schema.DATA_BYTES: 99}
    assert entry(big, presign) == {"seq": 10, "skipped": "over_frame_limit", "data_bytes": 99}


def test_payload_bytes_is_the_size_of_the_text_inside_a_json_string():
    text = json.dumps({"q": '"\\é\n'}, separators=(",", ":"))
    assert payload_bytes(text) == len(json.dumps(text)) - 2


def test_the_page_cut_by_bytes_is_exact_and_the_next_entry_would_not_fit():
    items = [inline(s, {"t": '"' * 1000}) for s in range(1, 50)]
    for budget in (5_000, 20_000, 33_333):
        page = build_page(iter(items), limit=1000, presign=presign, max_bytes=budget)
        n = len(page["messages"])
        assert page["next_after_seq"] == n
        # Measured as Lambda does: the whole proxy response's body string, JSON-escaped.
        assert payload_bytes(response(200, page)["body"]) <= budget
        bigger = {"messages": [entry(i, presign) for i in items[: n + 1]], "next_after_seq": n + 1}
        assert payload_bytes(response(200, bigger)["body"]) > budget


def test_the_first_entry_is_always_taken_so_paging_moves_on():
    page = build_page(iter([inline(1, "x" * 10_000), inline(2, 1)]), limit=10, presign=presign, max_bytes=100)
    assert [e["seq"] for e in page["messages"]] == [1] and page["next_after_seq"] == 1


def test_a_page_reads_one_item_past_its_limit_to_know_there_is_more():
    taken: list[int] = []

    def items():
        for s in range(1, 100):
            taken.append(s)
            yield inline(s, s)

    page = build_page(items(), limit=3, presign=presign)
    assert (page["next_after_seq"], taken) == (3, [1, 2, 3, 4])
    assert build_page(iter([inline(1, 1), inline(2, 2)]), limit=2, presign=presign)["next_after_seq"] is None
    assert build_page(iter([]), limit=2, presign=presign) == {"messages": [], "next_after_seq": None}


def expired(seq: int, at_s: int) -> dict:
    return {**inline(seq, seq), schema.MESSAGE_TTL_ATTRIBUTE: at_s}


def test_items_past_their_expiry_are_passed_over_and_paging_goes_past_them():
    # DynamoDB deletes an expired item days later, and its S3 object may be gone by then.
    now = 1_000_000
    items = [expired(1, now - 1), inline(2, 2), expired(3, now - 5), expired(4, now + 60), inline(5, 5)]
    page = build_page(iter(items), limit=10, presign=presign, now_s=now)
    assert [e["seq"] for e in page["messages"]] == [2, 4, 5] and page["next_after_seq"] is None
    page = build_page(iter(items), limit=1, presign=presign, now_s=now)
    assert [e["seq"] for e in page["messages"]] == [2] and page["next_after_seq"] == 2
    # A page that ends at its limit right after passing expired items goes on past them.
    page = build_page(iter(items[2:]), limit=1, presign=presign, now_s=now)
    assert [e["seq"] for e in page["messages"]] == [4] and page["next_after_seq"] == 4


def test_a_long_expired_stretch_ends_the_page_early_with_a_next_after_seq_past_it():
    now = 1_000_000
    read: list[int] = []

    def items():
        for s in range(1, 10_000):
            read.append(s)
            yield expired(s, now - 1)

    page = build_page(items(), limit=100, presign=presign, now_s=now, max_expired=50)
    assert page == {"messages": [], "next_after_seq": 50} and len(read) == 50


# --- pages from stored text --------------------------------------------------------------------


@pytest.mark.parametrize("data", [{"a": [1, "é"]}, "日本語", {"emoji": "😀 x"}, [None, True, 1.5, "\"\\"], "plain"])
def test_an_entry_spliced_from_stored_text_is_what_json_dumps_would_write(data):
    item = inline(7, data)
    assert entry_text(item, presign) == json.dumps(entry(item, presign), separators=(",", ":"))


def test_a_page_is_built_without_parsing_any_stored_item(monkeypatch):
    import wsfleet.message_pages as pages

    def refuse(*_, **__):
        raise AssertionError("a stored item was parsed")

    monkeypatch.setattr(pages, "_data", refuse)
    text, count = page_text(iter([inline(1, {"a": "é"}), inline(2, [1, 2])]), limit=10, presign=presign)
    assert count == 2
    assert json.loads(text) == {"messages": [{"seq": 1, "data": {"a": "é"}}, {"seq": 2, "data": [1, 2]}], "next_after_seq": None}


def test_a_four_megabyte_page_takes_about_its_own_size_in_memory():
    # Items of ~350 KB of small objects: parsed, each would be tens of MB of Python objects.
    items = [inline(s, [{"k": i, "v": "x"} for i in range(25_000)]) for s in range(1, 12)]
    tracemalloc.start()
    try:
        text, count = page_text(iter(items), limit=100, presign=presign)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count >= 5 and len(text) <= MAX_PAGE_BYTES
    assert peak < 3 * len(text), f"{peak / 1e6:.1f} MB for a {len(text) / 1e6:.1f} MB page"
