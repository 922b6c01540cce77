"""The START ``upstream`` object declared once (wsfleet.upstream_spec): every key's
validation, the stored form and its round trip, the URL and open message a connect
uses, and docs/api.md's table built from the declaration. Pure: no AWS, no sockets."""

from __future__ import annotations

import pytest

from wsfleet import upstream_spec
from wsfleet.pointer import Pointer
from wsfleet.upstream_spec import (
    DEFAULT,
    FIELDS,
    INVALID,
    MAX_HEADER_VALUE,
    MAX_HEADERS,
    MAX_OPEN_MESSAGE,
    MAX_SUBPROTOCOLS,
    SECRET_NOT_ALLOWED,
    Resume,
    SecretRef,
    Upstream,
    parse,
)
from wsfleet.validation import Invalid

PREFIX = "wsfleet/test/"
ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/test/feed-key-AbCdEf"
SUBSCRIBE = '{"op":"subscribe","stream":"{connection_id}","from_seq":{from_seq}}'


def ok(value: object, prefix: str = PREFIX) -> Upstream:
    return parse(value, secret_prefix=prefix)


def refused(value: object, prefix: str = PREFIX) -> Invalid:
    with pytest.raises(Invalid) as caught:
        parse(value, secret_prefix=prefix)
    return caught.value


def assert_refused(value: object, key: str, *, code: str = INVALID, prefix: str = PREFIX) -> Invalid:
    error = refused(value, prefix)
    assert error.code == code
    assert error.message.startswith(f"upstream.{key}: ") and error.message.endswith(".")
    return error


# --- the object ------------------------------------------------------------------------------


def test_no_upstream_is_the_default_protocol():
    assert ok(None) is DEFAULT
    assert ok({}) == DEFAULT
    assert DEFAULT.item() == {}
    assert (DEFAULT.seq_pointer.text, DEFAULT.data_pointer.text, DEFAULT.resume) == ("/seq", "/data", Resume.QUERY)


@pytest.mark.parametrize("value", [[], "none", 1, True])
def test_an_upstream_that_is_not_an_object_is_refused(value):
    assert refused(value).message == "upstream must be a JSON object."


def test_an_unknown_key_is_refused_naming_it_and_the_keys_there_are():
    error = refused({"resume": "none", "reconnect": "always"})
    assert error.code == INVALID
    assert "'reconnect'" in error.message
    assert all(f.key in error.message for f in FIELDS)


# --- headers and secret_headers ----------------------------------------------------------------


def test_headers_are_kept_as_given():
    up = ok({"headers": {"X-Client": "wsfleet", "X-Tab": "a\tb", "X-Empty": ""}})
    assert up.headers == (("X-Client", "wsfleet"), ("X-Tab", "a\tb"), ("X-Empty", ""))


@pytest.mark.parametrize("key", ["headers", "secret_headers"])
@pytest.mark.parametrize("name", ["X Client", "X:Client", "", "Ä-Key", "X(1)", "x" * 129, "X-Key\r\n"])
def test_a_header_name_that_is_not_an_http_token_is_refused(key, name):
    value = ARN if key == "secret_headers" else "v"
    assert "is not an HTTP token" in assert_refused({key: {name: value}}, key).message


@pytest.mark.parametrize("key", ["headers", "secret_headers"])
@pytest.mark.parametrize(
    "name", ["Host", "host", "Connection", "Upgrade", "Sec-WebSocket-Key", "sec-websocket-protocol", "Content-Length"]
)
def test_headers_the_handshake_sets_itself_are_refused(key, name):
    value = ARN if key == "secret_headers" else "v"
    assert "set by the WebSocket handshake itself" in assert_refused({key: {name: value}}, key).message


@pytest.mark.parametrize("value", ["a\rb", "a\nb", "a\r\nX-Injected: 1", "a\x00b", "a\x7fb", "caf\u00e9", "a\x0bb"])
def test_a_header_value_with_cr_lf_nul_or_anything_but_printable_ascii_is_refused_without_repeating_it(value):
    error = assert_refused({"headers": {"X-Client": value}}, "headers")
    assert "X-Client" in error.message and value not in error.message


@pytest.mark.parametrize("value", [7, None, ["a"], "x" * (MAX_HEADER_VALUE + 1)])
def test_a_header_value_that_is_not_a_short_string_is_refused(value):
    assert_refused({"headers": {"X-Client": value}}, "headers")


def test_a_header_value_of_the_longest_length_is_accepted():
    assert ok({"headers": {"X-Client": "x" * MAX_HEADER_VALUE}}).headers[0][1] == "x" * MAX_HEADER_VALUE


@pytest.mark.parametrize("key", ["headers", "secret_headers"])
def test_headers_must_be_an_object(key):
    assert_refused({key: [["X-Client", "v"]]}, key)


def test_a_header_in_both_headers_and_secret_headers_in_another_case_is_refused():
    error = assert_refused({"headers": {"authorization": "x"}, "secret_headers": {"Authorization": ARN}}, "secret_headers")
    assert "Authorization" in error.message


@pytest.mark.parametrize("key", ["headers", "secret_headers"])
def test_one_header_named_twice_in_another_case_is_refused(key):
    value = ARN if key == "secret_headers" else "v"
    assert "twice" in assert_refused({key: {"X-Key": value, "x-key": value}}, key).message


def test_at_most_so_many_headers_in_all():
    plain = {f"X-{n}": "v" for n in range(MAX_HEADERS // 2)}
    secret = {f"X-S{n}": ARN for n in range(MAX_HEADERS // 2)}
    assert len(ok({"headers": plain, "secret_headers": secret}).item()["headers"]) == MAX_HEADERS // 2
    error = refused({"headers": plain, "secret_headers": {**secret, "X-One-More": ARN}})
    assert error.code == INVALID and f"at most {MAX_HEADERS}" in error.message
    assert_refused({"headers": {f"X-{n}": "v" for n in range(MAX_HEADERS + 1)}}, "headers")


# --- secret ARNs -----------------------------------------------------------------------------


def test_a_secret_header_names_an_arn_and_optionally_a_json_key():
    up = ok({"secret_headers": {"Authorization": ARN, "X-Api-Key": ARN + "#api_key"}})
    assert up.secret_headers == (("Authorization", SecretRef(ARN)), ("X-Api-Key", SecretRef(ARN, "api_key")))
    assert up.item()["secret_headers"] == {"Authorization": ARN, "X-Api-Key": ARN + "#api_key"}


def test_a_secret_in_another_region_than_the_deployments_is_refused_when_the_region_is_given():
    elsewhere = ARN.replace(":us-east-1:", ":eu-west-1:")
    value = {"secret_headers": {"Authorization": elsewhere}}
    assert upstream_spec.parse(value, secret_prefix=PREFIX).secret_headers[0][1].arn == elsewhere
    with pytest.raises(Invalid) as refused:
        upstream_spec.parse(value, secret_prefix=PREFIX, region="us-east-1")
    assert refused.value.code == "secret_not_allowed" and "eu-west-1" in refused.value.message
    assert upstream_spec.parse({"secret_headers": {"Authorization": ARN}}, secret_prefix=PREFIX, region="us-east-1")


def test_a_secret_in_another_partition_is_accepted_under_the_prefix():
    arn = "arn:aws-cn:secretsmanager:cn-north-1:123456789012:secret:wsfleet/test/k-AbCdEf"
    assert ok({"secret_headers": {"Authorization": arn}}).secret_headers[0][1].arn == arn


@pytest.mark.parametrize(
    "arn",
    [
        ARN.replace("wsfleet/test/", "prod/"),
        ARN.replace("wsfleet/test/", "wsfleet/test-evil/"),  # a prefix of the text, not of the path
        ARN.replace("wsfleet/test/", "Wsfleet/test/"),
    ],
)
def test_a_secret_outside_the_prefix_is_not_allowed(arn):
    error = assert_refused({"secret_headers": {"Authorization": arn}}, "secret_headers", code=SECRET_NOT_ALLOWED)
    assert repr(PREFIX) in error.message


def test_with_an_empty_prefix_no_secret_is_allowed():
    error = assert_refused({"secret_headers": {"Authorization": ARN}}, "secret_headers", code=SECRET_NOT_ALLOWED, prefix="")
    assert "UPSTREAM_SECRET_PREFIX is empty" in error.message


@pytest.mark.parametrize(
    "text",
    [
        "Bearer sk-live-7f3a9c",
        "wsfleet/test/feed-key",  # a name, not an ARN
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:",
        "arn:aws:secretsmanager:us-east-1:1234:secret:wsfleet/test/k",  # account of 4 digits
        "arn:aws:ssm:us-east-1:123456789012:parameter/wsfleet/test/k",
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/test/k with space",
        ARN + "\n",
    ],
)
def test_what_is_not_a_secret_arn_is_refused_without_repeating_it(text):
    error = assert_refused({"secret_headers": {"X-Api-Key": text}}, "secret_headers")
    assert "X-Api-Key" in error.message and text.strip() not in error.message


@pytest.mark.parametrize("value", [7, None, {"arn": ARN}])
def test_a_secret_that_is_not_a_string_is_refused(value):
    assert_refused({"secret_headers": {"Authorization": value}}, "secret_headers")


@pytest.mark.parametrize("json_key", ["", "caf\u00e9", "a\nb", "k" * 257])
def test_a_json_key_after_the_hash_must_be_printable_ascii_of_bounded_length(json_key):
    assert "JSON key" in assert_refused({"secret_headers": {"Authorization": f"{ARN}#{json_key}"}}, "secret_headers").message


def test_a_json_key_may_hold_any_printable_character_even_a_hash():
    assert ok({"secret_headers": {"A": ARN + "#a b#c"}}).secret_headers[0][1] == SecretRef(ARN, "a b#c")


def test_parse_secret_ref_is_the_one_reading_of_an_arn_text():
    assert upstream_spec.parse_secret_ref(ARN + "#k", PREFIX) == SecretRef(ARN, "k")
    assert SecretRef(ARN, "k").text == ARN + "#k" and SecretRef(ARN).text == ARN


# --- subprotocols, open_message, pointers, resume -------------------------------------------------


def test_subprotocols_are_kept_in_order():
    assert ok({"subprotocols": ["v2.feed", "v1.feed"]}).subprotocols == ("v2.feed", "v1.feed")


@pytest.mark.parametrize(
    "value",
    [[], "v2", ["v 2"], ["v2", "v2"], [7], ["a/b"], [f"p{n}" for n in range(MAX_SUBPROTOCOLS + 1)]],
    ids=["empty", "string", "not a token", "twice", "number", "slash", "too many"],
)
def test_bad_subprotocols_are_refused(value):
    assert_refused({"subprotocols": value}, "subprotocols")


@pytest.mark.parametrize("value", ["", 7, None, "x" * (MAX_OPEN_MESSAGE + 1), "half \ud800 pair"])
def test_a_bad_open_message_is_refused(value):
    assert_refused({"open_message": value}, "open_message")


@pytest.mark.parametrize("key", ["seq_pointer", "data_pointer"])
@pytest.mark.parametrize("pointer", ["a", "seq", "/~2", "/a~", 7])
def test_a_bad_pointer_is_refused_naming_its_key(key, pointer):
    assert_refused({key: pointer}, key)


def test_the_seq_pointer_cannot_be_the_whole_frame_but_the_data_pointer_can():
    assert_refused({"seq_pointer": ""}, "seq_pointer")
    assert ok({"data_pointer": ""}).data_pointer.is_whole


def test_pointers_are_parsed():
    up = ok({"seq_pointer": "/meta/sequence", "data_pointer": "/payload"})
    assert up.seq_pointer.resolve({"meta": {"sequence": 5}}) == 5
    assert up.data_pointer == Pointer.parse("/payload")


@pytest.mark.parametrize("value", ["replay", "QUERY", "", None, 1])
def test_an_unknown_resume_mode_is_refused_listing_the_modes(value):
    error = assert_refused({"resume": value}, "resume")
    assert "query, open_message, none" in error.message


def test_resume_by_open_message_needs_an_open_message_with_from_seq():
    assert_refused({"resume": "open_message"}, "resume")
    assert_refused({"resume": "open_message", "open_message": '{"op":"subscribe"}'}, "resume")
    assert ok({"resume": "open_message", "open_message": SUBSCRIBE}).resume is Resume.OPEN_MESSAGE


def test_the_other_resume_modes_take_an_open_message_with_or_without_from_seq():
    assert ok({"resume": "none", "open_message": '{"op":"subscribe"}'}).resume is Resume.NONE
    assert ok({"open_message": SUBSCRIBE}).resume is Resume.QUERY


# --- the stored form ---------------------------------------------------------------------------

FULL = {
    "headers": {"X-Client": "wsfleet"},
    "secret_headers": {"Authorization": ARN + "#token"},
    "subprotocols": ["v2.feed"],
    "open_message": SUBSCRIBE,
    "seq_pointer": "/meta/sequence",
    "data_pointer": "",
    "resume": "open_message",
    "secret_query": {"api_key": ARN + "#key"},
}


@pytest.mark.parametrize(
    "value",
    [
        FULL,
        {"resume": "none"},
        {"data_pointer": ""},
        {"seq_pointer": "/u", "data_pointer": ""},
        {"headers": {"X-Empty": ""}},
        {"secret_headers": {"X-Api-Key": ARN}},
    ],
)
def test_the_stored_form_parses_back_to_the_same_upstream(value):
    up = ok(value)
    assert up.item() == value
    assert ok(up.item()) == up


def test_keys_at_their_defaults_are_dropped_from_the_stored_form():
    up = ok({"seq_pointer": "/seq", "data_pointer": "/data", "resume": "query", "headers": {}, "subprotocols": ["v1"]})
    assert up.item() == {"subprotocols": ["v1"]}
    assert ok({"seq_pointer": "/seq", "data_pointer": "/data", "resume": "query"}).item() == {}


def test_the_same_upstream_written_in_another_key_order_has_the_same_stored_form():
    assert ok(dict(reversed(list(FULL.items())))).item() == ok(FULL).item()


def test_the_stored_form_holds_arns_and_never_a_secret_value():
    item = ok(FULL).item()
    assert item["secret_headers"] == {"Authorization": ARN + "#token"}
    assert item["secret_query"] == {"api_key": ARN + "#key"}


def test_secret_query_names_secrets_like_secret_headers_and_lists_them_after_the_headers():
    up = ok({"secret_headers": {"X-Key": ARN}, "secret_query": {"token": ARN + "#t"}})
    assert [name for name, _ in up.secret_refs] == ["X-Key", "token"]
    assert up.secret_query[0][1].json_key == "t"


@pytest.mark.parametrize(
    "value, code",
    [
        ({"token": "sk-live-123"}, INVALID),  # a value, not an ARN: never repeated
        ({"from_seq": ARN}, INVALID),  # the worker's own parameter
        ({"to ken": ARN}, INVALID),
        ({"a&b=c": ARN}, INVALID),
        ({}, INVALID),
        ({"token": ARN.replace("wsfleet/test/", "prod/")}, SECRET_NOT_ALLOWED),
    ],
)
def test_a_bad_secret_query_is_refused_naming_the_key(value, code):
    err = assert_refused({"secret_query": value}, "secret_query", code=code)
    assert "sk-live-123" not in err.message


# --- what a connect uses -------------------------------------------------------------------------


def test_resume_by_query_adds_from_seq_to_the_url_and_the_other_modes_leave_it_as_given():
    url = "wss://feed.example.com/s?topic=px"
    assert ok(None).url(url, 42) == "wss://feed.example.com/s?topic=px&from_seq=42"
    assert ok({"resume": "none"}).url(url, 42) == url
    assert ok({"resume": "open_message", "open_message": SUBSCRIBE}).url(url, 42) == url


def test_the_open_message_has_its_placeholders_filled_and_no_open_message_is_none():
    up = ok({"resume": "open_message", "open_message": SUBSCRIBE})
    assert up.opening(from_seq=101, connection_id="feed-1") == '{"op":"subscribe","stream":"feed-1","from_seq":101}'
    assert ok(None).opening(from_seq=1, connection_id="feed-1") is None


# --- the declaration and the docs' table -----------------------------------------------------------


def test_every_key_of_the_object_is_declared_once_with_a_flag_and_a_sentence():
    keys = [f.key for f in FIELDS]
    assert keys == list(upstream_spec.FIELD_NAMES) and len(set(keys)) == len(keys)
    # (format and seq: tests/test_feed_formats.py; ignore, max_silence_seconds: tests/test_feed_health.py)
    assert set(keys) == set(FULL) | {"format", "seq", "ignore", "max_silence_seconds"}
    for f in FIELDS:
        assert f.flag.startswith("--") and f.metavar and f.help.endswith(".")
    assert next(f for f in FIELDS if f.key == "resume").choices == tuple(r.value for r in Resume)


def test_the_markdown_table_has_a_row_per_key_with_its_flag_and_default():
    table = upstream_spec.markdown_table()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [f.key for f in FIELDS]
    for f, row in zip(FIELDS, rows, strict=True):
        assert f.flag in row
        # Pipes inside a cell are escaped, so that every row has the header's five cells.
        assert row.replace("\\|", "").count("|") == 6
    assert "`/seq`" in rows[4] and "`query`" in rows[6]
