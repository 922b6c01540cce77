"""JSON Pointers (RFC 6901) as an upstream's seq_pointer / data_pointer use them. Pure."""

from __future__ import annotations

import pytest

from wsfleet.pointer import MAX_POINTER_LENGTH, MAX_POINTER_TOKENS, MISSING, Pointer, PointerError

# The example document of RFC 6901 section 5.
RFC_DOC = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "c%d": 2,
    "e^f": 3,
    "g|h": 4,
    "i\\j": 5,
    'k"l': 6,
    " ": 7,
    "m~n": 8,
}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", RFC_DOC),
        ("/foo", ["bar", "baz"]),
        ("/foo/0", "bar"),
        ("/", 0),
        ("/a~1b", 1),
        ("/c%d", 2),
        ("/e^f", 3),
        ("/g|h", 4),
        ("/i\\j", 5),
        ('/k"l', 6),
        ("/ ", 7),
        ("/m~0n", 8),
    ],
)
def test_the_rfc_6901_examples_resolve_as_the_rfc_says(text, expected):
    assert Pointer.parse(text).resolve(RFC_DOC) == expected


def test_tilde_escapes_are_undone_in_order_so_tilde_zero_one_is_a_literal_tilde_one():
    doc = {"~1": "tilde-one", "/": "slash"}
    assert Pointer.parse("/~01").resolve(doc) == "tilde-one"
    assert Pointer.parse("/~1").resolve(doc) == "slash"
    assert Pointer.parse("/~01").tokens == ("~1",)


def test_a_nested_pointer_reaches_through_objects_and_arrays():
    frame = {"type": "update", "meta": {"sequence": 42}, "payload": {"rows": [{"px": 1.5}]}}
    assert Pointer.parse("/meta/sequence").resolve(frame) == 42
    assert Pointer.parse("/payload/rows/0/px").resolve(frame) == 1.5


@pytest.mark.parametrize("index", ["-", "01", "00", "2", "-1", "+1", "1.0", " 1", "1 ", "0x1", "1e0", "", "9" * 19])
def test_an_array_index_resolves_only_when_decimal_without_leading_zeros_and_in_range(index):
    assert Pointer.parse(f"/foo/{index}").resolve(RFC_DOC) is MISSING


def test_a_leading_zero_is_still_a_member_name_of_an_object():
    assert Pointer.parse("/01").resolve({"01": "x"}) == "x"
    assert Pointer.parse("/-").resolve({"-": "dash"}) == "dash"


@pytest.mark.parametrize(
    "text, doc",
    [
        ("/missing", RFC_DOC),
        ("/foo/0/deeper", RFC_DOC),  # through a string
        ("/a", 5),
        ("/a", None),
        ("/a", "text"),
        ("/0", "text"),  # a string is not an array
        ("/a/b", {"a": True}),
    ],
)
def test_a_pointer_that_leads_nowhere_resolves_to_missing_and_never_raises(text, doc):
    assert Pointer.parse(text).resolve(doc) is MISSING


def test_a_null_value_is_a_value_not_missing():
    assert Pointer.parse("/seq").resolve({"seq": None}) is None


def test_the_empty_pointer_is_the_whole_document_and_only_it_is_whole():
    assert Pointer.parse("").is_whole
    assert not Pointer.parse("/").is_whole  # the member named ""
    assert Pointer.parse("").resolve([1, 2]) == [1, 2]


@pytest.mark.parametrize(
    "text, says",
    [
        ("a", "must be empty or start with '/'"),
        ("seq", "must be empty or start with '/'"),
        ("/~2", "'~' not followed by 0 or 1"),
        ("/~", "'~' not followed by 0 or 1"),
        ("/a~/b", "'~' not followed by 0 or 1"),
        ("/" + "x" * MAX_POINTER_LENGTH, f"at most {MAX_POINTER_LENGTH} characters"),
        ("/a" * (MAX_POINTER_TOKENS + 1), f"at most {MAX_POINTER_TOKENS} tokens"),
        (7, "must be a string"),
        (None, "must be a string"),
    ],
)
def test_what_is_not_a_json_pointer_is_refused_with_a_sentence(text, says):
    with pytest.raises(PointerError, match=f".*{says}".replace("(", r"\(").replace(")", r"\)")):
        Pointer.parse(text)


def test_the_longest_pointers_allowed_parse():
    assert len(Pointer.parse("/" + "x" * (MAX_POINTER_LENGTH - 1)).tokens) == 1
    assert len(Pointer.parse("/a" * MAX_POINTER_TOKENS).tokens) == MAX_POINTER_TOKENS


def test_a_pointer_keeps_its_text_as_written():
    assert Pointer.parse("/a~1b/~0").text == "/a~1b/~0"
    assert str(Pointer.parse("/meta/sequence")) == "/meta/sequence"
    assert Pointer.parse("/a~1b/~0").tokens == ("a/b", "~")
