"""What the event router accepts as a connection_id and a ws_url: pure, table-driven."""

from __future__ import annotations

import ipaddress

import pytest

from wsfleet.validation import (
    MAX_WS_URL_LENGTH,
    Allowlist,
    Invalid,
    check_resolved,
    check_connection_id,
    check_ws_url,
    is_internal,
    without_addresses,
)

# As in the embedded default plus a typical production list.
ALLOWLIST = Allowlist.of(["127.0.0.1", "*.feeds.example.com", "stream.example.org", "[2001:4860:4860::8888]", "8.8.4.4"])


def refusal(fn, *args) -> Invalid:
    with pytest.raises(Invalid) as info:
        fn(*args)
    return info.value


# --- connection_id -------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["a", "A-z_0.9:x", "tenant:42.feed-7_b", "x" * 128, "0", "::", ".a", "a..", "..:"],
)
def test_connection_id_of_allowed_characters_and_length_is_accepted(value):
    assert check_connection_id(value) == value


@pytest.mark.parametrize(
    "value",
    [
        "",
        "x" * 129,
        "has space",
        "slash/inside",
        "percent%3A",
        "hash#",
        "new\nline",
        "trailing\n",
        "ünïcode",
        "٣",  # a Unicode digit is not 0-9
        "emoji😀",
        None,
        42,
        ["a"],
    ],
)
def test_connection_id_outside_the_alphabet_or_length_is_refused(value):
    err = refusal(check_connection_id, value)
    assert err.code == "invalid_connection_id"
    assert "1 to 128" in err.message


@pytest.mark.parametrize("value", [".", "..", "...", "." * 128])
def test_connection_id_made_only_of_dots_is_refused_as_a_path_segment(value):
    err = refusal(check_connection_id, value)
    assert err.code == "invalid_connection_id"
    assert "only of dots" in err.message


# --- ws_url: accepted ------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "wss://eu.feeds.example.com/stream?topic=a&x=1",
        "ws://eu.feeds.example.com:8080",
        "wss://a.b.feeds.example.com/",  # any depth of subdomain
        "WSS://EU.Feeds.Example.COM/Path",  # scheme and host are case-insensitive
        "wss://stream.example.org/v1",
        "wss://stream.example.org./v1",  # a fully qualified name is the same host
        "ws://127.0.0.1:8765/",  # an internal address that is listed exactly
        "wss://[2001:4860:4860::8888]/",
        "wss://[2001:4860:4860:0:0:0:0:8888]:443/",  # another spelling of the listed address
        "wss://8.8.4.4/",
        "wss://10.0.0.1.feeds.example.com/",  # a name that merely starts with digits
    ],
)
def test_ws_url_to_an_allowed_host_is_accepted_unchanged(url):
    assert check_ws_url(url, ALLOWLIST) == url


# --- ws_url: malformed -----------------------------------------------------------------


@pytest.mark.parametrize(
    "url, says",
    [
        ("https://eu.feeds.example.com/", "ws:// or wss://"),
        ("http://eu.feeds.example.com/", "ws:// or wss://"),
        ("eu.feeds.example.com/stream", "ws:// or wss://"),
        ("file:///etc/passwd", "ws:// or wss://"),
        ("wss:eu.feeds.example.com", "must name a host"),
        ("wss:///stream", "must name a host"),
        ("wss://user:pw@eu.feeds.example.com/", "user name or password"),
        ("wss://eu.feeds.example.com@evil.test/", "user name or password"),
        ("wss://eu.feeds.example.com/#frag", "fragment"),
        ("wss://eu.feeds.example.com:0/", "port"),
        ("wss://eu.feeds.example.com:99999/", "host and port"),
        ("wss://eu.feeds.example.com:http/", "host and port"),
        ("wss://[::1/", "host and port"),
        ("wss://eu.feeds.example.com/a b", "printable ASCII"),
        ("wss://eu.feeds.example.com\\@evil.test/", "printable ASCII"),
        ("wss://eu.feeds.exämple.com/", "printable ASCII"),
        ("wss://eu.feeds.example.com/\r\nHost: x", "printable ASCII"),
        ("wss://under%5fscore.feeds.example.com/", "not a valid host name"),
        ("wss://-bad.feeds.example.com/", "not a valid host name"),
        ("wss://a..feeds.example.com/", "not a valid host name"),
        ("wss://[fe80::1%25eth0]/", "zone id"),
        ("wss://[v1.future]/", "valid"),
        ("wss://" + "a" * MAX_WS_URL_LENGTH, "at most 2048"),
        ("", "non-empty string"),
        (None, "non-empty string"),
        (["wss://eu.feeds.example.com/"], "non-empty string"),
    ],
)
def test_malformed_ws_url_is_refused_with_a_sentence_saying_why(url, says):
    err = refusal(check_ws_url, url, ALLOWLIST)
    assert err.code == "invalid_ws_url"
    assert says in err.message
    assert err.message.endswith(".")


def test_ws_url_of_exactly_the_maximum_length_is_accepted():
    url = "wss://stream.example.org/" + "p" * (MAX_WS_URL_LENGTH - len("wss://stream.example.org/"))
    assert len(url) == MAX_WS_URL_LENGTH
    assert check_ws_url(url, ALLOWLIST) == url


# --- ws_url: host allow-list -------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "wss://feeds.example.com/",  # '*.domain' does not cover the bare domain
        "wss://evilfeeds.example.com/",
        "wss://feeds.example.com.evil.test/",
        "wss://example.com/",
        "wss://stream.example.org.evil.test/",
        "wss://sub.stream.example.org/",  # an exact name does not cover its subdomains
        "wss://8.8.8.8/",  # a public address that is not listed
        "wss://[2001:4860:4860::8844]/",
    ],
)
def test_ws_url_to_a_host_not_in_the_allow_list_is_refused(url):
    err = refusal(check_ws_url, url, ALLOWLIST)
    assert err.code == "ws_host_not_allowed"
    assert "ALLOWED_WS_HOSTS" in err.message


def test_empty_allow_list_refuses_every_host_and_says_so():
    err = refusal(check_ws_url, "wss://eu.feeds.example.com/", Allowlist.of([]))
    assert err.code == "ws_host_not_allowed"
    assert "ALLOWED_WS_HOSTS is empty" in err.message


def test_allow_list_entries_are_case_insensitive_and_trimmed():
    allow = Allowlist.of([" Stream.Example.ORG ", "*.FEEDS.example.com"])
    assert check_ws_url("wss://stream.example.org/", allow)
    assert check_ws_url("wss://eu.feeds.example.com/", allow)


@pytest.mark.parametrize(
    "pattern, url",
    [
        ("*.0.0.1", "ws://127.0.0.1/"),
        ("*.1", "ws://10.0.0.1/"),
        ("*.254", "ws://169.254.169.254/"),
        ("*.8", "wss://8.8.8.8/"),
    ],
)
def test_wildcard_pattern_never_matches_an_ip_literal(pattern, url):
    err = refusal(check_ws_url, url, Allowlist.of([pattern]))
    assert err.code == "ws_host_not_allowed"


# --- ws_url: SSRF guard -------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.2",  # loopback, but not the listed 127.0.0.1
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # instance metadata
        "169.254.170.2",  # ECS task metadata
        "100.64.0.1",  # shared address space
        "0.0.0.0",
        "224.0.0.1",
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
        "[::1]",
        "[::]",
        "[fe80::1]",
        "[fc00::1]",
        "[fd00:ec2::254]",  # instance metadata over IPv6
        "[ff02::1]",
        "[::ffff:127.0.0.1]",  # IPv4-mapped: the listed 127.0.0.1 does not cover it
        "[::ffff:169.254.169.254]",
        "[::ffff:a9fe:a9fe]",
        "[::127.0.0.1]",  # IPv4-compatible
        "[64:ff9b::a9fe:a9fe]",  # NAT64 of 169.254.169.254
        "[2002:a9fe:a9fe::1]",  # 6to4 of 169.254.169.254
    ],
)
def test_internal_ip_literal_is_refused_even_with_a_wildcard_allow_list(host):
    allow = Allowlist.of(["127.0.0.1", "*.com", "*.1", "*.254"])
    err = refusal(check_ws_url, f"ws://{host}:9000/", allow)
    assert err.code == "ws_host_not_allowed"
    assert "loopback, private, link-local" in err.message
    assert "exact address is listed" in err.message


@pytest.mark.parametrize(
    "host",
    [
        "2130706433",  # decimal 127.0.0.1
        "0x7f000001",
        "0x7f.0.0.1",
        "0177.0.0.1",  # octal
        "127.1",  # short form
        "017700000001",
        "127.0.0.01",
        "1.2.3.4.5",
        "999.1.1.1",
        "example.123",  # a numeric last label is an IPv4 address to browsers and resolvers
        "0x",
    ],
)
def test_non_standard_ipv4_spelling_is_refused_even_if_listed(host):
    allow = Allowlist.of([host, "127.0.0.1", f"*.{host}"])
    err = refusal(check_ws_url, f"ws://{host}/", allow)
    assert err.code == "invalid_ws_url"
    assert "dotted-quad" in err.message


@pytest.mark.parametrize(
    "entry, url",
    [
        ("10.0.0.5", "ws://10.0.0.5:8080/"),
        ("169.254.169.254", "ws://169.254.169.254/"),
        ("::1", "ws://[::1]:8765/"),
        ("[::1]", "ws://[::1]/"),
        ("::ffff:127.0.0.1", "ws://[::ffff:127.0.0.1]/"),
    ],
)
def test_internal_ip_literal_is_accepted_when_that_exact_address_is_listed(entry, url):
    assert check_ws_url(url, Allowlist.of([entry])) == url


@pytest.mark.parametrize(
    "address, internal",
    [
        ("8.8.8.8", False),
        ("2001:4860:4860::8888", False),
        ("2600:1f18::1", False),
        ("127.0.0.1", True),
        ("::ffff:10.0.0.1", True),
        ("64:ff9b::808:808", True),  # NAT64, even of a public address
        ("2002:808:808::1", True),  # 6to4, even of a public address
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", True),  # Teredo
    ],
)
def test_is_internal_refuses_ipv6_forms_that_carry_ipv4_or_tunnel(address, internal):
    assert is_internal(ipaddress.ip_address(address)) is internal


# --- what the worker connects to: DNS answers checked against internal ranges --------


def test_a_host_name_resolving_to_a_public_address_is_connected_to_that_address():
    assert check_resolved("feed.example.com", ["93.184.216.34"], Allowlist.of(["*.example.com"])) == "93.184.216.34"


def test_a_pattern_matched_host_resolving_only_to_internal_addresses_is_refused():
    for internal in (["169.254.169.254"], ["10.0.0.7", "127.0.0.1"], ["::1"], ["fd00::1"]):
        with pytest.raises(Invalid) as err:
            check_resolved("feed.example.com", internal, Allowlist.of(["*.example.com"]))
        assert err.value.code == "ws_host_not_allowed" and "feed.example.com" in err.value.message


def test_the_first_public_answer_is_used_when_dns_mixes_internal_and_public():
    assert check_resolved("feed.example.com", ["10.0.0.7", "93.184.216.34"], Allowlist.of(["*.example.com"])) == "93.184.216.34"


def test_an_exactly_listed_host_or_address_may_be_internal():
    assert check_resolved("localhost", ["127.0.0.1"], Allowlist.of(["localhost"])) == "127.0.0.1"
    assert check_resolved("127.0.0.1", ["127.0.0.1"], Allowlist.of(["127.0.0.1"])) == "127.0.0.1"
    with pytest.raises(Invalid):
        check_resolved("localhost", ["127.0.0.1"], Allowlist.of(["*.localhost"]))


# --- last_error's text ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, shown",
    [
        ("connect to 10.0.0.7:443 failed", "connect to <address>:443 failed"),
        ("resolved to 169.254.169.254", "resolved to <address>"),
        ("refused by [fd00::1]:80", "refused by [<address>]:80"),
        ("::1 and fe80::1%eth0 refused", "<address> and <address> refused"),
        ("mapped ::ffff:10.1.2.3", "mapped ::ffff:<address>"),
    ],
)
def test_without_addresses_hides_every_ip_address(text, shown):
    assert without_addresses(text) == shown


@pytest.mark.parametrize(
    "text",
    ["the upstream refused the handshake: HTTP 1.1 403", "at 12:30:45 v1.2.3",
     "secret arn:aws:secretsmanager:us-east-1:123456789012:secret:a/b-x#key cannot be read: AccessDenied"],
)
def test_without_addresses_leaves_other_text_as_it_is(text):
    assert without_addresses(text) == text
