"""Where credentials may travel (wsfleet.credentials): secrets only over wss:// (or
ws:// to loopback), no credential in plain sight, secrets bound to their hosts' tags."""

from __future__ import annotations

import pytest

from wsfleet.credentials import (
    CLEARTEXT_SECRET,
    SECRET_IN_PLAIN,
    check_plain,
    check_secret_query_names,
    check_travel,
    host_allowed,
    is_loopback_host,
    tag_hosts,
)
from wsfleet.validation import Invalid


def refusal(fn, *args, **kwargs) -> Invalid:
    with pytest.raises(Invalid) as caught:
        fn(*args, **kwargs)
    return caught.value


@pytest.mark.parametrize(
    "url",
    ["ws://feed.example.com/s", "ws://10.0.0.5/s", "ws://[2001:db8::1]/s", "ws://localhost.example.com/s",
     "ws://127.example.com/s", "WS://feed.example.com/s"],
)
def test_secrets_over_ws_to_a_host_that_is_not_loopback_are_cleartext_secrets(url):
    err = refusal(check_travel, url.replace("WS://", "ws://"), has_secrets=True)
    assert err.code == CLEARTEXT_SECRET and "wss://" in err.message


@pytest.mark.parametrize(
    "url", ["wss://feed.example.com/s", "ws://localhost:8080/s", "ws://127.0.0.1:9/s", "ws://127.8.9.10/s", "ws://[::1]:80/s"]
)
def test_secrets_travel_over_wss_or_to_loopback(url):
    check_travel(url, has_secrets=True)


def test_ws_without_secrets_is_not_this_rules_business():
    check_travel("ws://feed.example.com/s", has_secrets=False)


@pytest.mark.parametrize("host, loopback", [("localhost", True), ("LOCALHOST.", True), ("127.0.0.1", True),
                                            ("127.255.0.9", True), ("[::1]", True), ("::1", True),
                                            ("128.0.0.1", False), ("localhost.evil.com", False), ("::2", False)])
def test_loopback_hosts(host, loopback):
    assert is_loopback_host(host) is loopback


@pytest.mark.parametrize(
    "query",
    ["token=abc", "TOKEN=abc", "access_token=abc", "api_key=1", "apikey=1", "api-key=1", "key=1", "secret=1",
     "password=1", "auth=1", "signature=1", "sig=1", "jwt=1", "session=1", "X-Amz-Signature=1",
     "X-Amz-Credential=1", "X-Amz-Security-Token=1", "x-amz-security-token=1", "auth_token=1", "client_secret=1",
     "db_password=1", "topic=px&token=abc", "%74oken=abc", "token=", "Session_Token=1"],
)
def test_a_credential_like_query_parameter_in_ws_url_is_a_secret_in_plain(query):
    err = refusal(check_plain, f"wss://feed.example.com/s?{query}", [])
    assert err.code == SECRET_IN_PLAIN
    assert "secret_query" in err.message and "abc" not in err.message


@pytest.mark.parametrize(
    "header", ["Authorization", "authorization", "AUTHORIZATION", "Cookie", "X-Api-Key", "x-api-key",
               "Proxy-Authorization", "X-Auth-Token", "X-Client-Secret", "X-Amz-Security-Token", "Api-Key"]
)
def test_a_credential_like_plain_header_is_a_secret_in_plain(header):
    err = refusal(check_plain, "wss://feed.example.com/s", ["X-Client", header])
    assert err.code == SECRET_IN_PLAIN
    assert "secret_headers" in err.message


@pytest.mark.parametrize("query", ["topic=px", "from_seq=3", "keyboard=1", "monkey=1", "tokens_per_second=4", ""])
def test_ordinary_query_parameters_and_headers_pass(query):
    check_plain(f"wss://feed.example.com/s?{query}", ["X-Client", "Accept-Language", "X-Request-Id", "User-Agent"])


def test_a_secret_query_parameter_already_in_ws_url_is_refused():
    err = refusal(check_secret_query_names, "wss://feed.example.com/s?Topic=px", ["topic"])
    assert err.code == "invalid_upstream"
    check_secret_query_names("wss://feed.example.com/s?topic=px", ["api_key"])


# --- secrets bound to hosts ---------------------------------------------------------------


def test_the_hosts_tag_is_read_from_describe_secrets_tags_and_untagged_is_none():
    assert tag_hosts([{"Key": "team", "Value": "a"}, {"Key": "wsfleet:hosts", "Value": " Stream.Example.com  .feeds.example.com. "}]) == (
        "stream.example.com",
        ".feeds.example.com",
    )
    assert tag_hosts([{"Key": "team", "Value": "a"}]) is None
    assert tag_hosts(None) is None
    assert tag_hosts([{"Key": "wsfleet:hosts", "Value": ""}]) == ()


@pytest.mark.parametrize(
    "host, allowed",
    [
        ("stream.example.com", True),
        ("STREAM.example.com.", True),
        ("feeds.example.com", True),
        ("eu.feeds.example.com", True),
        ("a.b.feeds.example.com", True),
        ("other.example.com", False),
        ("stream.example.com.evil.io", False),
        ("evilfeeds.example.com", False),
        ("example.com", False),
    ],
)
def test_a_secret_goes_only_to_the_hosts_and_domains_its_tag_lists(host, allowed):
    assert host_allowed(("stream.example.com", ".feeds.example.com"), host) is allowed


def test_an_empty_tag_allows_no_host():
    assert not host_allowed((), "stream.example.com")
