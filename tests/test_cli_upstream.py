"""``wsfleet start``'s upstream flags (built from upstream_spec.FIELDS) through the router
behind the local API, and the upstream and last_error in ``get``, ``connections`` and
``status``, against the emulator."""

from __future__ import annotations

import io
import json
import re
import shlex
from pathlib import Path

import boto3
import pytest

from tests.test_cli import URL, run, run_json
from tests.test_router import post_event
from wsfleet import schema
from wsfleet.cli import build_parser
from wsfleet.cli.api import ApiClient
from sim.api import LocalApi
from wsfleet.logs import JsonLogger
from wsfleet.router import Router
from wsfleet.store import ConnectionsStore, now_ms
from wsfleet.upstream_spec import FIELDS

pytestmark = pytest.mark.timeout(60)

PREFIX = "wsfleet/test/"
ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/test/feed-key-AbCdEf"
SUBSCRIBE = '{"op":"subscribe","stream":"{connection_id}","from_seq":{from_seq}}'

ALL_FLAGS = [
    "--header", "X-Client=wsfleet",
    "--header", "X-Tenant=a=b",  # only the first '=' separates the name
    "--secret-header", f"Authorization={ARN}#token",
    "--subprotocol", "v2.feed",
    "--subprotocol", "v1.feed",
    "--open-message", SUBSCRIBE,
    "--seq-pointer", "/meta/sequence",
    "--data-pointer", "",
    "--resume", "open_message",
]  # fmt: skip
ALL_UPSTREAM = {
    "headers": {"X-Client": "wsfleet", "X-Tenant": "a=b"},
    "secret_headers": {"Authorization": ARN + "#token"},
    "subprotocols": ["v2.feed", "v1.feed"],
    "open_message": SUBSCRIBE,
    "seq_pointer": "/meta/sequence",
    "data_pointer": "",
    "resume": "open_message",
}


@pytest.fixture
def api(aws_env):
    router = Router.from_env(
        {**aws_env, "ALLOWED_WS_HOSTS": "127.0.0.1", "UPSTREAM_SECRET_PREFIX": PREFIX},
        logger=JsonLogger(io.StringIO(), component="router"),
    )
    with LocalApi(router.handle) as running:
        yield running


def get_body(capsys, aws_env, api, connection_id: str) -> dict:
    got = run_json(capsys, aws_env, "get", connection_id, "--api", api.url)
    assert got["status"] == 200
    return got["body"]


def note_error(ddb, aws_env, connection_id: str, text: str, at_ms: int) -> None:
    """What an owner writes when its upstream refuses it (tested with the worker)."""
    ddb.update_item(
        TableName=aws_env["TABLE_NAME"],
        Key={schema.PK: {"S": schema.connection_pk(connection_id)}},
        UpdateExpression="SET #e = :e, #t = :t",
        ExpressionAttributeNames={"#e": schema.LAST_ERROR, "#t": schema.LAST_ERROR_AT_MS},
        ExpressionAttributeValues={":e": {"S": text}, ":t": {"N": str(at_ms)}},
    )


# --- the flags --------------------------------------------------------------------------------


def test_every_key_of_the_upstream_object_has_its_declared_flag_on_start():
    start = build_parser()._subparsers._group_actions[0].choices["start"]
    flags = {option: action for action in start._actions for option in action.option_strings}
    for f in FIELDS:
        action = flags[f.flag]
        assert action.dest == f.key and f.help in action.help
        assert (type(action).__name__ == "_AppendAction") == f.repeat
        assert tuple(action.choices or ()) == f.choices


def test_start_with_every_upstream_flag_stores_the_object_they_describe(capsys, aws_env, api):
    code, out, err = run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url, *ALL_FLAGS)

    assert (code, out.strip(), err) == (0, "c1: STARTED (created), HTTP 202", "")
    assert get_body(capsys, aws_env, api, "c1")["upstream"] == ALL_UPSTREAM


def test_start_without_upstream_flags_sends_no_upstream_object():
    sent: list[dict] = []

    def capture(request):
        sent.append(json.loads(request.data))
        return 202, b"{}"

    ApiClient("http://127.0.0.1:1", send=capture).start("c1", URL + "c1")
    ApiClient("http://127.0.0.1:1", send=capture).start("c1", URL + "c1", {"resume": "none"})

    assert sent == [
        {"event_type": "START", "connection_id": "c1", "ws_url": URL + "c1"},
        {"event_type": "START", "connection_id": "c1", "ws_url": URL + "c1", "upstream": {"resume": "none"}},
    ]


def test_the_same_start_again_is_200_and_another_upstream_is_409_until_stop_then_start(capsys, aws_env, api):
    assert run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url, *ALL_FLAGS)[0] == 0
    assert run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url, *ALL_FLAGS)[1].strip() == (
        "c1: STARTED (unchanged), HTTP 200"
    )

    code, out, err = run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url, "--resume", "none")
    assert (code, out) == (1, "")
    assert err == (
        "wsfleet: Connection c1 is already STARTED with a different upstream; "
        "STOP it, then START it again to apply the new one (HTTP 409).\n"
    )

    assert run(capsys, aws_env, "stop", "c1", "--api", api.url)[0] == 0
    assert run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url, "--resume", "none")[1].strip() == (
        "c1: STARTED (restarted), HTTP 202"
    )
    assert get_body(capsys, aws_env, api, "c1")["upstream"] == {"resume": "none"}


@pytest.mark.parametrize("flag", ["--header", "--secret-header"])
def test_a_header_flag_without_an_equals_sign_is_a_usage_error_that_does_not_repeat_the_value(capsys, aws_env, api, flag):
    code, out, err = run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url, flag, "sk-live-7f3a9c")

    assert (code, out) == (2, "")
    assert f"argument {flag}: must be NAME=" in err and "with '=' after the header name" in err
    assert "sk-live-7f3a9c" not in err
    assert run(capsys, aws_env, "get", "c1", "--api", api.url)[0] == 1  # nothing was sent


def test_an_unknown_resume_mode_is_a_usage_error_listing_the_modes(capsys, aws_env, api):
    code, _, err = run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url, "--resume", "replay")
    assert code == 2 and "invalid choice: 'replay'" in err and "'open_message'" in err


def test_a_header_named_twice_is_an_error_before_anything_is_sent(capsys, aws_env, api):
    argv = ["start", "c1", URL + "c1", "--api", api.url, "--header", "X-Key=1", "--header", "x-key=2"]
    code, _, err = run(capsys, aws_env, *argv)
    assert code == 1
    assert err == "wsfleet: --header names the header x-key twice (header names are case-insensitive).\n"
    assert run(capsys, aws_env, "get", "c1", "--api", api.url)[0] == 1


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--seq-pointer", "seq"], "upstream.seq_pointer: JSON Pointer 'seq' must be empty or start with '/'"),
        (["--secret-header", "Authorization=" + ARN.replace("wsfleet/test/", "prod/")], "not under the allowed prefix"),
        (["--resume", "open_message"], "upstream.resume: open_message resumes only through an open_message"),
        (["--header", "Host=evil.example.com"], "set by the WebSocket handshake itself"),
    ],
)
def test_the_apis_400_is_shown_as_its_sentence_and_nothing_is_stored(capsys, aws_env, api, flags, says):
    code, out, err = run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url, *flags)

    assert (code, out) == (1, "")
    assert says in err and err.endswith("(HTTP 400).\n") and err.count("\n") == 1
    assert run(capsys, aws_env, "get", "c1", "--api", api.url)[0] == 1


# --- what get, connections and status show ------------------------------------------------------


def test_get_shows_the_upstream_with_arns_and_the_last_error_with_its_age(capsys, aws_env, api, ddb):
    run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url, *ALL_FLAGS)
    run(capsys, aws_env, "start", "c2", URL + "c2", "--api", api.url)
    note_error(ddb, aws_env, "c1", "handshake refused: HTTP 403 after re-reading the secrets", now_ms() - 90_000)

    code, out, _ = run(capsys, aws_env, "get", "c1", "--api", api.url)

    assert code == 0
    fields = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines()[1:])
    assert json.loads(fields["upstream"]) == ALL_UPSTREAM
    assert fields["last_error"] == "handshake refused: HTTP 403 after re-reading the secrets"
    assert re.fullmatch(r"\d+\s+\(1m\d\ds ago\)", fields["last_error_at_ms"])

    fields = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in run(capsys, aws_env, "get", "c2", "--api", api.url)[1].splitlines()[1:])
    assert (fields["upstream"], fields["last_error"], fields["last_error_at_ms"]) == ("default", "-", "-")


def test_get_shows_frames_bytes_humanly_and_the_newest_frames_age(capsys, aws_env, api, ddb):
    run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url)
    run(capsys, aws_env, "start", "c2", URL + "c2", "--api", api.url)
    ddb.update_item(  # as a counting checkpoint leaves it (tested with the store)
        TableName=aws_env["TABLE_NAME"],
        Key={schema.PK: {"S": schema.connection_pk("c1")}},
        UpdateExpression="SET #f = :f, #b = :b, #t = :t",
        ExpressionAttributeNames={"#f": schema.FRAMES, "#b": schema.BYTES, "#t": schema.LAST_FRAME_AT_MS},
        ExpressionAttributeValues={":f": {"N": "12345"}, ":b": {"N": str(3 * 1024 * 1024 + 1)}, ":t": {"N": str(now_ms() - 5_000)}},
    )

    def fields(cid: str) -> dict:
        out = run(capsys, aws_env, "get", cid, "--api", api.url)[1]
        return dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines()[1:])

    shown = fields("c1")
    assert (shown["frames"], shown["bytes"]) == ("12,345", "3,145,729  (3.0 MiB)")
    assert re.fullmatch(r"\d+\s+\([5-9]\.\ds ago\)", shown["last_frame_at_ms"])
    shown = fields("c2")
    assert (shown["frames"], shown["bytes"], shown["last_frame_at_ms"]) == ("0", "0", "0  (none counted yet)")


def test_connections_shows_upstream_and_last_error_columns_when_a_connection_has_one(capsys, ddb, aws_env):
    store = ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4)
    store.start("c1", URL + "c1", {"resume": "none", "seq_pointer": "/u", "data_pointer": "", "secret_headers": {"X-Key": ARN}})
    store.start("c2", URL + "c2")
    note_error(ddb, aws_env, "c1", "secret unreadable: AccessDeniedException", now_ms())

    rows = run_json(capsys, aws_env, "connections")
    assert [(r["connection_id"], r["upstream"], r["last_error"]) for r in rows] == [
        ("c1", {"resume": "none", "seq_pointer": "/u", "data_pointer": "", "secret_headers": {"X-Key": ARN}},
         "secret unreadable: AccessDeniedException"),
        ("c2", {}, None),
    ]  # fmt: skip

    out = run(capsys, aws_env, "connections")[1]
    header, c1, c2 = out.splitlines()
    assert re.search(r"WS URL\s+UPSTREAM\s+LAST ERROR$", header)
    assert "resume=none seq=/u data=(whole) secrets=X-Key" in c1 and ARN not in c1
    assert c1.endswith("secret unreadable: AccessDeniedException")
    assert re.search(r"\sdefault\s+-$", c2)


def test_connections_without_upstreams_or_errors_keeps_its_columns(capsys, ddb, aws_env):
    ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4).start("c1", URL + "c1")
    header = run(capsys, aws_env, "connections")[1].splitlines()[0]
    assert header.split()[-2:] == ["WS", "URL"]


def test_status_lists_the_started_connections_refused_by_their_upstream_longest_first(capsys, ddb, aws_env):
    store = ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4)
    for cid in ("c1", "c2", "c3"):
        store.start(cid, URL + cid)
    note_error(ddb, aws_env, "c1", "handshake refused: HTTP 401", now_ms() - 5_000)
    note_error(ddb, aws_env, "c2", "handshake refused:\n HTTP 403", now_ms() - 125_000)  # shown on one line

    view = run_json(capsys, aws_env, "status")
    assert [(r["connection_id"], r["last_error"]) for r in view["refused"]] == [
        ("c2", "handshake refused:\n HTTP 403"),
        ("c1", "handshake refused: HTTP 401"),
    ]
    assert 125 <= view["refused"][0]["since_s"] < 200

    out = run(capsys, aws_env, "status")[1]
    assert "STARTED and refused by their upstream: 2" in out
    assert re.search(r"^\s+c2\s+2m\d\ds ago\s+handshake refused: HTTP 403$", out, re.MULTILINE)


# --- the API docs' worked examples -----------------------------------------------------------

API_DOCS = Path(__file__).resolve().parents[1] / "docs" / "api.md"
LOCAL_PREFIX = "wsfleet/local/"  # the embedded default's, which the examples use


def worked_examples() -> list[tuple[str, list[str]]]:
    """(curl body, wsfleet start argv) of each worked example, ``$ARN`` left in place."""
    text = API_DOCS.read_text(encoding="utf-8")
    section = text[text.index("**Worked examples, one per resume mode.**") : text.index("## Reading what was stored")]
    section = section.replace("\\\n", " ")  # shell line continuations
    bodies = [m.replace("'\"$ARN\"'", "$ARN") for m in re.findall(r"-XPOST \S+ -d '((?:[^']|'\"\$ARN\"')*)'", section)]
    commands = [shlex.split(line)[1:] for line in re.findall(r"^wsfleet start .*$", section, re.MULTILINE)]
    return list(zip(bodies, commands, strict=True))


def test_the_api_docs_worked_examples_are_accepted_and_each_curl_body_is_the_same_start_as_its_command(
    capsys, aws_env, emulator
):
    examples = worked_examples()
    assert len(examples) == 3
    secrets = boto3.client("secretsmanager", endpoint_url=emulator.endpoint_url, region_name="us-east-1")
    arn = secrets.create_secret(Name=LOCAL_PREFIX + f"feed-api-key-{now_ms()}", SecretString="s3cret-1")["ARN"]
    router = Router.from_env(
        {**aws_env, "ALLOWED_WS_HOSTS": "127.0.0.1", "UPSTREAM_SECRET_PREFIX": LOCAL_PREFIX},
        logger=JsonLogger(io.StringIO(), component="router"),
    )
    resumes = []
    with LocalApi(router.handle) as api:
        for body, argv in examples:
            start = json.loads(body.replace("$ARN", arn))
            assert start["event_type"] == "START"
            resp = router.handle(post_event(json.dumps(start)))
            assert resp["statusCode"] == 202, resp["body"]

            argv = [arg.replace("$ARN", arn) for arg in argv]
            argv[argv.index("--api") + 1] = api.url
            code, out, err = run(capsys, aws_env, *argv)
            assert (code, err) == (0, ""), err
            assert out.strip() == f"{start['connection_id']}: STARTED (unchanged), HTTP 200"
            resumes.append(get_body(capsys, aws_env, api, start["connection_id"])["upstream"].get("resume", "query"))
    assert resumes == ["query", "open_message", "none"]
