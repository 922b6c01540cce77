"""The operators' CLI: the API commands against the router behind the local API, the
table commands against the emulator, the SigV4 signature of requests to a deployed
API (checked by an independent computation), and the installed ``wsfleet`` command."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import time
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qsl, quote, urlsplit

import boto3
import pytest
from botocore.credentials import Credentials

from wsfleet import schema, stack_outputs
from wsfleet.cli import main, watch
from wsfleet.cli.api import ApiClient, region_in_url, urlopen
from wsfleet.cli.errors import CliError
from sim.api import LocalApi
from wsfleet.logs import JsonLogger
from wsfleet.router import Router
from wsfleet.store import Acquired, ConnectionsStore, SessionsStore, now_ms

pytestmark = pytest.mark.timeout(60)

RUNTIME = Path(__file__).resolve().parents[1] / "runtime"
URL = "ws://127.0.0.1:9/streams/"


def run(capsys, env, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv), env=env)
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, env, *argv: str):
    code, out, err = run(capsys, env, *argv, "--json")
    assert (code, err) == (0, ""), err
    return json.loads(out)


@pytest.fixture
def api(aws_env):
    # The router's log lines go elsewhere: stdout is what the CLI prints.
    router = Router.from_env(
        {**aws_env, "ALLOWED_WS_HOSTS": "127.0.0.1"}, logger=JsonLogger(io.StringIO(), component="router")
    )
    with LocalApi(router.handle) as running:
        yield running


@pytest.fixture
def conns(ddb, aws_env):
    return ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4)


@pytest.fixture
def sessions(ddb, aws_env):
    return SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"])


def open_session(ddb, aws_env, worker_id: str, *, ago_ms: int = 0, lease_ms: int = 60_000) -> str:
    """A session opened ``ago_ms`` ago (so expired if that is more than ``lease_ms``)."""
    clock = now_ms() - ago_ms
    session_id = f"{worker_id}#{clock}-test"
    SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"], clock_ms=lambda: clock).open(
        session_id, worker_id=worker_id, lease_ms=lease_ms, max_connections=100
    )
    return session_id


def acquire(ddb, aws_env, connection_id: str, session_id: str, worker_id: str, *, ago_ms: int = 0) -> None:
    clock = now_ms() - ago_ms
    store = ConnectionsStore(
        ddb, aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"], clock_ms=lambda: clock
    )
    assert isinstance(store.acquire(connection_id, session_id=session_id, worker_id=worker_id), Acquired)


# --- start, stop, get through the API ---------------------------------------------------------


def test_start_get_stop_go_through_the_local_api_and_print_the_outcome(capsys, aws_env, api):
    code, out, err = run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url)
    assert (code, out.strip(), err) == (0, "c1: STARTED (created), HTTP 202", "")

    assert (
        run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url)[1].strip()
        == "c1: STARTED (unchanged), HTTP 200"
    )

    code, out, _ = run(capsys, aws_env, "get", "c1", "--api", api.url)
    assert code == 0
    fields = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines()[1:])
    assert fields["desired_state"] == "STARTED" and fields["ws_url"] == URL + "c1"
    assert fields["lease_expires_at_ms"] == "0  (free)" and fields["lease_owner"] == "-"

    assert run(capsys, aws_env, "stop", "c1", "--api", api.url)[1].strip() == "c1: STOPPED (stopped), HTTP 202"
    assert run(capsys, aws_env, "stop", "c1", "--api", api.url)[1].strip() == "c1: STOPPED (already_stopped), HTTP 200"


def test_restart_stops_and_starts_again_with_its_own_url_and_delete_removes_a_stopped_one(capsys, aws_env, api):
    run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url, "--seq-pointer", "/n")
    code, out, err = run(capsys, aws_env, "restart", "c1", "--api", api.url)
    assert (code, out.strip(), err) == (0, "c1: STARTED (restarted), HTTP 202", "")
    got = run_json(capsys, aws_env, "get", "c1", "--api", api.url)["body"]
    assert got["ws_url"] == URL + "c1" and got["upstream"] == {"seq_pointer": "/n"}

    # The router's refusals (a STARTED one, one still held) are its tests'; here, the command.
    run(capsys, aws_env, "stop", "c1", "--api", api.url)
    assert run(capsys, aws_env, "delete", "c1", "--api", api.url)[1].strip() == "c1: deleted, HTTP 200"


def test_api_commands_print_the_status_and_the_apis_body_as_json(capsys, aws_env, api):
    assert run_json(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url) == {
        "status": 202,
        "body": {"connection_id": "c1", "desired_state": "STARTED", "outcome": "created"},
    }
    got = run_json(capsys, aws_env, "get", "c1", "--api", api.url + "/")
    assert got["status"] == 200
    assert set(got["body"]) == {"connection_id", *schema.PUBLIC_FIELDS}
    assert got["body"]["fence_token"] == 0 and got["body"]["lease_owner"] == ""


@pytest.mark.parametrize(
    "argv, status, sentence",
    [
        (("get", "nope"), 404, "No connection nope is known"),
        (("stop", "nope"), 404, "No connection nope is known"),
        (("start", "c1", URL + "other"), 409, "already STARTED with a different ws_url"),
        (("start", "c2", "http://127.0.0.1/x"), 400, "ws_url"),
        (("start", "bad id", URL + "x"), 400, "connection_id"),
    ],
)
def test_an_api_error_exits_1_with_the_apis_sentence_on_stderr(capsys, aws_env, api, argv, status, sentence):
    run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url)

    code, out, err = run(capsys, aws_env, *argv, "--api", api.url)

    assert code == 1 and out == ""
    assert err.startswith("wsfleet: ") and sentence in err and f"(HTTP {status})." in err
    assert len(err.strip().splitlines()) == 1

    code, out, _ = run(capsys, aws_env, *argv, "--api", api.url, "--json")
    assert code == 1 and json.loads(out)["status"] == status


def test_an_api_that_cannot_be_reached_is_one_sentence(capsys, aws_env):
    code, out, err = run(capsys, aws_env, "get", "c1", "--api", "http://127.0.0.1:9")
    assert code == 1 and out == ""
    assert err.startswith("wsfleet: cannot reach the API at http://127.0.0.1:9/connections/c1") and err.count("\n") == 1


def test_an_api_command_naming_no_fleet_says_how_to_name_it_once(capsys, aws_env):
    code, out, err = run(capsys, aws_env, "get", "c1")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith("wsfleet: which fleet? Name it once: --env NAME (or WSFLEET_ENV=NAME)")


# --- SigV4 ---------------------------------------------------------------------------------------


class Capture:
    """A loopback HTTP server that keeps each request as it arrived."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        captured = self.requests

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                captured.append({"method": self.command, "path": self.path, "headers": self.headers, "body": body})
                reply = b'{"connection_id": "c1", "desired_state": "STARTED", "outcome": "created"}'
                self.send_response(202)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            do_GET = do_POST = _any

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        # Polled every 50 ms, not 0.5 s: shutdown() waits for the loop to notice.
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def send(self, request):
        """Deliver a request meant for elsewhere here, its headers (Host too) untouched."""
        target = urlsplit(request.full_url)
        request.full_url = self.url + target.path + (f"?{target.query}" if target.query else "")
        return urlopen(request, direct=True)


@pytest.fixture
def capture():
    server = Capture()
    yield server
    server.server.shutdown()
    server.server.server_close()


def expected_signature(secret: str, request: dict, signed: list[str], amz_date: str, scope: str) -> str:
    """SigV4 computed from the request as received, with hashlib and hmac only."""
    headers = {name.lower(): " ".join(value.split()) for name, value in request["headers"].items()}
    path, _, query = request["path"].partition("?")
    pairs = sorted((quote(k, safe="-_.~"), quote(v, safe="-_.~")) for k, v in parse_qsl(query, keep_blank_values=True))
    canonical = "\n".join(
        [
            request["method"],
            # The path as sent, URI-encoded once more ("twice" in AWS's words, S3 aside).
            quote(path, safe="/~"),
            "&".join(f"{k}={v}" for k, v in pairs),
            "".join(f"{name}:{headers[name]}\n" for name in signed),
            ";".join(signed),
            hashlib.sha256(request["body"]).hexdigest(),
        ]
    )
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret).encode()
    for part in scope.split("/"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


AUTH = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<scope>[^,]+), SignedHeaders=(?P<signed>[^,]+), Signature=(?P<sig>[0-9a-f]{64})"
)


@pytest.mark.parametrize("token", [None, "session-token"])
def test_requests_to_a_deployed_api_carry_a_sigv4_signature_for_execute_api_that_verifies(capture, token):
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    url = "https://abc123.execute-api.eu-west-1.amazonaws.com/v1/"
    client = ApiClient(url, credentials=credentials, region=region_in_url(url), send=capture.send)

    reply = client.start("c1", URL + "c1")

    assert reply.status == 202
    [request] = capture.requests
    assert (request["method"], request["path"]) == ("POST", "/v1/events")
    assert json.loads(request["body"]) == {"event_type": "START", "connection_id": "c1", "ws_url": URL + "c1"}
    auth = AUTH.fullmatch(request["headers"]["Authorization"])
    assert auth, request["headers"]["Authorization"]
    amz_date = request["headers"]["X-Amz-Date"]
    assert auth["key"] == "AKIDEXAMPLE"
    assert auth["scope"] == f"{amz_date[:8]}/eu-west-1/execute-api/aws4_request"
    signed = auth["signed"].split(";")
    assert {"host", "x-amz-date", "content-type"} <= set(signed)
    assert request["headers"]["Host"] == "abc123.execute-api.eu-west-1.amazonaws.com"
    assert (request["headers"].get("X-Amz-Security-Token"), "x-amz-security-token" in signed) == (
        token,
        token is not None,
    )
    assert auth["sig"] == expected_signature(credentials.secret_key, request, signed, amz_date, auth["scope"])


def test_a_get_is_signed_with_the_region_given_when_the_host_names_none(capture):
    credentials = Credentials("AKIDEXAMPLE", "secret")
    client = ApiClient(
        "https://fleet.example.com/", credentials=credentials, region="ap-southeast-2", send=capture.send
    )

    client.get("c-1:x")

    [request] = capture.requests
    assert request["path"] == "/connections/c-1:x"
    auth = AUTH.fullmatch(request["headers"]["Authorization"])
    assert auth["scope"].endswith("/ap-southeast-2/execute-api/aws4_request")
    assert auth["sig"] == expected_signature(
        "secret", request, auth["signed"].split(";"), request["headers"]["X-Amz-Date"], auth["scope"]
    )


def test_a_page_of_messages_is_signed_with_its_query_string(capture):
    credentials = Credentials("AKIDEXAMPLE", "secret", "token")
    url = "https://abc123.execute-api.eu-west-1.amazonaws.com/v1"
    ApiClient(url, credentials=credentials, region=region_in_url(url), send=capture.send).messages(
        "c1", after_seq=-1, limit=1000
    )

    [request] = capture.requests
    assert request["path"] == "/v1/connections/c1/messages?after_seq=-1&limit=1000"
    auth = AUTH.fullmatch(request["headers"]["Authorization"])
    assert auth["sig"] == expected_signature(
        "secret", request, auth["signed"].split(";"), request["headers"]["X-Amz-Date"], auth["scope"]
    )


def test_a_loopback_api_is_not_signed(capture):
    ApiClient(capture.url, send=capture.send).get("c1")

    [request] = capture.requests
    assert "Authorization" not in request["headers"] and "X-Amz-Date" not in request["headers"]


def test_a_deployed_api_needs_credentials_and_a_region():
    with pytest.raises(CliError, match="no AWS credentials"):
        ApiClient("https://abc.execute-api.us-east-1.amazonaws.com/v1", credentials=None, region="us-east-1")
    with pytest.raises(CliError, match="pass --region"):
        ApiClient("https://fleet.example.com", credentials=Credentials("a", "b"), region=None)


def test_the_region_is_read_from_an_execute_api_host_name():
    assert region_in_url("https://abc.execute-api.eu-central-1.amazonaws.com/v1/") == "eu-central-1"
    assert region_in_url("https://abc.execute-api.cn-north-1.amazonaws.com.cn/v1/") == "cn-north-1"
    assert region_in_url("https://fleet.example.com/v1/") is None


# --- status -----------------------------------------------------------------------------------------


@pytest.fixture
def fleet(ddb, aws_env, conns):
    """w1 live with c1 (acquired 50 s ago) and c2; w2 expired 110 s ago holding c3;
    c4 STARTED and free; c5 STOPPED."""
    for cid in ("c1", "c2", "c3", "c4", "c5"):
        conns.start(cid, URL + cid)
    conns.stop("c5", sessions=SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"]))
    w1 = open_session(ddb, aws_env, "w1")
    SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"]).renew(w1, lease_ms=60_000, active=2, max_connections=100)
    acquire(ddb, aws_env, "c1", w1, "w1", ago_ms=50_000)
    acquire(ddb, aws_env, "c2", w1, "w1")
    w2 = open_session(ddb, aws_env, "w2", ago_ms=120_000, lease_ms=10_000)
    acquire(ddb, aws_env, "c3", w2, "w2", ago_ms=115_000)
    return {"w1": w1, "w2": w2}


def test_status_shows_live_workers_counts_unowned_and_the_oldest_checkpoint(capsys, aws_env, fleet):
    status = run_json(capsys, aws_env, "status")

    [worker] = status["workers"]
    assert (worker["worker_id"], worker["session_id"], worker["active"], worker["max_connections"]) == (
        "w1",
        fleet["w1"],
        2,
        100,
    )
    assert 50 < worker["expires_in_s"] <= 60 and 0 <= worker["heartbeat_age_s"] < 10 and worker["session_age_s"] < 10
    [dead] = status["sessions_not_live_holding"]
    assert (dead["worker_id"], dead["state"], dead["ended_by"]) == ("w2", "LIVE, expired", "")
    assert 100 < dead["expired_s_ago"] < 120
    assert status["connections"] == {"STARTED": 4, "STOPPED": 1, "total": 5}
    unowned = {u["connection_id"]: u for u in status["unowned"]}
    assert set(unowned) == {"c3", "c4"}
    assert unowned["c3"]["partition"] == schema.owner_key_session(fleet["w2"]) and unowned["c3"]["worker_id"] == "w2"
    assert 100 < unowned["c3"]["unowned_for_s"] < 120  # since w2's session expired
    assert unowned["c4"]["partition"] == schema.owner_key_free("c4", 4) and unowned["c4"]["worker_id"] == ""
    assert status["oldest_checkpoint"]["connection_id"] == "c1" and 50 <= status["oldest_checkpoint"]["age_s"] < 60

    code, out, err = run(capsys, aws_env, "status")
    assert (code, err) == (0, "")
    assert "workers: 1 live session" in out
    assert re.search(r"^\s+w1\s+\S+\s+2/100\s", out, re.MULTILINE)
    assert re.search(r"^\s+w2\s+LIVE, expired\s", out, re.MULTILINE)
    assert "connections: 4 STARTED, 1 STOPPED (5 in all)" in out
    assert "STARTED but unowned: 2" in out
    assert re.search(r"^\s+c3\s+w2 \(LIVE, expired\)\s+1m", out, re.MULTILINE)
    assert re.search(rf"^\s+c4\s+{schema.owner_key_free('c4', 4)}\s", out, re.MULTILINE)
    assert re.search(r"oldest checkpoint of an owned connection: c1, 5\d\.\ds ago", out)


def test_status_watch_prints_a_snapshot_each_interval_without_escape_codes_and_ctrl_c_exits_0(
    capsys, aws_env, fleet, monkeypatch
):
    naps = []

    def nap(seconds):
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(watch, "time", SimpleNamespace(sleep=nap, time=time.time))
    code, out, err = run(capsys, aws_env, "status", "--watch", "--interval", "0.5")
    assert (code, err) == (0, "") and naps == [0.5, 0.5]
    assert out.count("workers: 1 live session") == 2 and out.count("STARTED but unowned: 2") == 2 and "\x1b" not in out


def test_status_follows_a_dead_session_from_ended_to_drained(capsys, aws_env, fleet, sessions, conns):
    sessions.end_expired(fleet["w2"], ended_by="w1", max_clock_skew_ms=1000)
    status = run_json(capsys, aws_env, "status")
    assert [(d["state"], d["ended_by"]) for d in status["sessions_not_live_holding"]] == [("ENDED", "w1")]
    assert {u["connection_id"]: u["session_state"] for u in status["unowned"]} == {"c3": "ENDED", "c4": ""}

    conns.free_orphan("c3", dead_session=fleet["w2"])
    sessions.leave_ring(fleet["w2"])
    status = run_json(capsys, aws_env, "status")
    assert status["sessions_not_live_holding"] == []
    assert {u["connection_id"]: u["partition"] for u in status["unowned"]} == {
        "c3": schema.owner_key_free("c3", 4),
        "c4": schema.owner_key_free("c4", 4),
    }


def test_status_lists_a_live_sessions_handoff_not_taken_yet_as_unowned(capsys, ddb, aws_env, fleet):
    # c1 (w1's oldest) handed off 30 s ago: still attached to live w1, but nobody holds its
    # socket (GET, the observer and `wsfleet connections` say so too).
    handing = ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4, clock_ms=lambda: now_ms() - 30_000)
    assert handing.release("c1", session_id=fleet["w1"], fence_token=1, last_seq=0, handoff=True)

    status = run_json(capsys, aws_env, "status")
    unowned = {u["connection_id"]: u for u in status["unowned"]}
    assert set(unowned) == {"c1", "c3", "c4"}
    assert (unowned["c1"]["partition"], unowned["c1"]["worker_id"], unowned["c1"]["session_state"]) == (
        schema.owner_key_session(fleet["w1"]),
        "w1",
        "handed off",
    )
    assert 30 <= unowned["c1"]["unowned_for_s"] < 40  # since the release
    assert status["oldest_checkpoint"]["connection_id"] == "c2"  # c1 is owned by nobody
    code, out, _ = run(capsys, aws_env, "status")
    assert code == 0 and "STARTED but unowned: 3" in out
    assert re.search(r"^\s+c1\s+w1 \(handed off\)\s+3\d\.\ds", out, re.MULTILINE)

    # Taken by a peer: owned again, and no longer listed.
    w3 = open_session(ddb, aws_env, "w3")
    acquire(ddb, aws_env, "c1", w3, "w3")
    assert {u["connection_id"] for u in run_json(capsys, aws_env, "status")["unowned"]} == {"c3", "c4"}


def test_status_reads_free_partitions_past_state_shards_that_the_scan_saw(capsys, ddb, aws_env):
    wide = ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=16)
    ids = [f"x{n}" for n in range(40) if schema.shard_for(f"x{n}", 16) >= 4][:3]
    for cid in ids:
        wide.start(cid, URL + cid)

    status = run_json(capsys, {**aws_env, "STATE_SHARDS": "4"}, "status")

    assert sorted(u["connection_id"] for u in status["unowned"]) == sorted(ids)


def test_status_of_an_empty_fleet(capsys, aws_env):
    code, out, _ = run(capsys, aws_env, "status")
    assert code == 0
    assert "workers: 0 live sessions" in out and "STARTED but unowned: 0" in out
    assert "oldest checkpoint of an owned connection: none owned" in out


# --- connections and messages ------------------------------------------------------------------------


def test_connections_lists_every_one_with_its_owner_or_only_a_state(capsys, aws_env, fleet):
    rows = run_json(capsys, aws_env, "connections")
    assert [(r["connection_id"], r["desired_state"], r["owner"], r["owned"]) for r in rows] == [
        ("c1", "STARTED", "w1", True),
        ("c2", "STARTED", "w1", True),
        ("c3", "STARTED", "w2 (LIVE, expired)", False),
        ("c4", "STARTED", "-", False),
        ("c5", "STOPPED", "-", False),
    ]
    assert rows[0]["fence_token"] == 1 and rows[0]["ws_url"] == URL + "c1" and rows[0]["lease_session"] == fleet["w1"]

    assert [r["connection_id"] for r in run_json(capsys, aws_env, "connections", "--state", "STOPPED")] == ["c5"]

    code, out, _ = run(capsys, aws_env, "connections")
    assert code == 0 and out.splitlines()[0].split() == [
        "CONNECTION",
        "STATE",
        "OWNER",
        "FENCE",
        "LAST",
        "SEQ",
        "UPDATED",
        "WS",
        "URL",
    ]
    assert re.search(r"^c3\s+STARTED\s+w2 \(LIVE, expired\)\s+1\s+0\s", out, re.MULTILINE)


def test_connections_shows_one_handed_off_and_not_taken_yet_as_owned_by_nobody(capsys, aws_env, conns, fleet):
    assert conns.release("c2", session_id=fleet["w1"], fence_token=1, last_seq=0, handoff=True)
    rows = {r["connection_id"]: r for r in run_json(capsys, aws_env, "connections")}
    assert (rows["c2"]["owner"], rows["c2"]["owned"]) == ("w1 (handed off)", False)  # as GET: nobody holds it
    assert (rows["c1"]["owner"], rows["c1"]["owned"]) == ("w1", True)


def test_connections_of_one_worker_come_from_its_sessions(capsys, aws_env, fleet):
    assert [r["connection_id"] for r in run_json(capsys, aws_env, "connections", "--worker", "w1")] == ["c1", "c2"]
    assert [r["connection_id"] for r in run_json(capsys, aws_env, "connections", "--worker", "w2")] == ["c3"]
    assert run_json(capsys, aws_env, "connections", "--worker", "w1", "--state", "STOPPED") == []
    code, out, err = run(capsys, aws_env, "connections", "--worker", "wl")  # a typo of w1
    assert code == 1 and out == "" and "no worker 'wl' in the sessions table (live or in the ring: w1, w2)" in err


# --- where the tables and the API are -----------------------------------------------------------------


def test_table_commands_without_the_tables_name_the_missing_variables(capsys, aws_env):
    env = {k: v for k, v in aws_env.items() if k not in ("TABLE_NAME", "SESSIONS_TABLE_NAME")}
    code, out, err = run(capsys, env, "status")
    assert (code, out) == (1, "")
    assert err == (
        "wsfleet: TABLE_NAME, SESSIONS_TABLE_NAME not set: name the fleet with --env NAME (or WSFLEET_ENV=NAME), "
        "pass --stack, or export the fleet's environment.\n"
    )


def test_a_table_that_does_not_exist_is_one_sentence(capsys, aws_env):
    code, _, err = run(capsys, {**aws_env, "TABLE_NAME": "nope"}, "connections")
    assert code == 1 and "ResourceNotFoundException" in err and "check the table names" in err and err.count("\n") == 1


def make_stacks(emulator, aws_env, api, names: dict[str, str]) -> dict[str, str]:
    """A stateful and a service stack named ``names`` with the outputs the stacks declare
    (``wsfleet.stack_outputs``, and the dashboard's)."""
    cfn = boto3.client("cloudformation", endpoint_url=emulator.endpoint_url, region_name=aws_env["AWS_REGION"])
    outputs = {
        "stateful": {
            stack_outputs.CONNECTIONS_TABLE_NAME: aws_env["TABLE_NAME"],
            stack_outputs.SESSIONS_TABLE_NAME: aws_env["SESSIONS_TABLE_NAME"],
            stack_outputs.MESSAGES_TABLE_NAME: aws_env["MESSAGES_TABLE_NAME"],
            stack_outputs.START_QUEUE_URL: "https://sqs.us-east-1.amazonaws.com/123456789012/start",
        },
        "service": {stack_outputs.API_URL: api.url + "/", "DashboardUrl": "https://console.aws.amazon.com/x"},
    }
    for which, name in names.items():
        template = {
            "Resources": {"Queue": {"Type": "AWS::SQS::Queue"}},
            "Outputs": {key: {"Value": value} for key, value in outputs[which].items()},
        }
        cfn.create_stack(StackName=name, TemplateBody=json.dumps(template))
    return names


@pytest.fixture
def stacks(emulator, aws_env, api):
    suffix = aws_env["TABLE_NAME"].removeprefix("conn-")
    return make_stacks(emulator, aws_env, api, {"stateful": f"st-{suffix}", "service": f"sv-{suffix}"})


@pytest.fixture
def environment(emulator, aws_env, api):
    """An environment's name, its two stacks deployed as app.py names them."""
    name = "e" + aws_env["TABLE_NAME"].removeprefix("conn-")
    make_stacks(emulator, aws_env, api, {"stateful": f"wsfleet-{name}-stateful", "service": f"wsfleet-{name}-service"})
    return name


def test_an_environment_named_once_finds_the_api_and_the_tables_through_its_stacks(capsys, aws_env, api, environment):
    env = {k: v for k, v in aws_env.items() if not k.endswith("TABLE_NAME")}
    assert run_json(capsys, env, "start", "c1", URL + "c1", "--env", environment)["status"] == 202
    named = {**env, "WSFLEET_ENV": environment}
    assert run_json(capsys, named, "get", "c1")["body"]["desired_state"] == schema.STARTED
    assert run_json(capsys, named, "status")["connections"]["STARTED"] == 1
    assert [r["connection_id"] for r in run_json(capsys, env, "connections", "--env", environment)] == ["c1"]


def test_flags_come_before_variables_and_the_more_specific_before_the_less(capsys, aws_env, api, environment):
    # WSFLEET_API names the API where no environment is named, before WSFLEET_ENV's stack.
    assert run_json(capsys, {**aws_env, "WSFLEET_API": api.url}, "start", "c1", URL + "c1")["status"] == 202
    wrong = {**aws_env, "WSFLEET_ENV": "nope", "WSFLEET_API": api.url}
    assert run_json(capsys, wrong, "get", "c1")["status"] == 200
    code, _, err = run(capsys, {**aws_env, "WSFLEET_ENV": "nope"}, "get", "c1")
    assert code == 1 and "stack wsfleet-nope-service does not exist" in err
    # The worker's TABLE_NAME names the tables before WSFLEET_ENV does; --env before both.
    assert run_json(capsys, {**aws_env, "WSFLEET_ENV": "nope"}, "status")["connections"]["STARTED"] == 1
    code, _, err = run(capsys, aws_env, "status", "--env", "nope")
    assert code == 1 and "stack wsfleet-nope-stateful does not exist" in err


def test_plan_reads_the_environment_named_once(capsys):
    assert main(["plan", "--connections", "1000", "--json"], env={"WSFLEET_ENV": "prod"}) == 0
    assert json.loads(capsys.readouterr().out)["env"] == "prod"
    assert main(["plan", "--connections", "1000", "--json", "--env", "dev"], env={"WSFLEET_ENV": "prod"}) == 0
    assert json.loads(capsys.readouterr().out)["env"] == "dev"


def test_stack_outputs_name_the_tables_and_the_api(capsys, aws_env, stacks, emulator):
    env = {k: v for k, v in aws_env.items() if not k.endswith("TABLE_NAME")}
    assert run_json(capsys, env, "start", "c1", URL + "c1", "--stack", stacks["service"])["status"] == 202
    # The stacks' alarms in ALARM state, found by the stack's prefix (wsfleet-<env>-), nobody else's.
    cloudwatch = boto3.client("cloudwatch", endpoint_url=emulator.endpoint_url, region_name=aws_env["AWS_REGION"])
    for name in (f"{stacks['stateful']}-connections-unowned", f"other-{stacks['stateful']}-unowned"):
        cloudwatch.put_metric_alarm(AlarmName=name, MetricName="UnownedConnections", Namespace="WsFleet", Statistic="Maximum",
                                    Period=60, EvaluationPeriods=1, Threshold=0, ComparisonOperator="GreaterThanThreshold")
        cloudwatch.set_alarm_state(AlarmName=name, StateValue="ALARM", StateReason="1 datapoint above 0")
    status = run_json(capsys, env, "status", "--stack", stacks["stateful"])
    assert status["connections"]["STARTED"] == 1
    assert [(a["name"], a["reason"]) for a in status["alarms"]["firing"]] == [
        (f"{stacks['stateful']}-connections-unowned", "1 datapoint above 0")
    ]
    assert f"{stacks['stateful']}-connections-unowned" in run(capsys, env, "status", "--stack", stacks["stateful"])[1]
    assert [r["connection_id"] for r in run_json(capsys, env, "connections", "--stack", stacks["stateful"])] == ["c1"]


def test_the_wrong_stack_is_named_in_one_sentence(capsys, aws_env, stacks):
    code, _, err = run(capsys, aws_env, "status", "--stack", stacks["service"])
    assert code == 1 and "has no table outputs: name the stateful stack (wsfleet-<env>-stateful)" in err
    assert stack_outputs.CONNECTIONS_TABLE_NAME in err and err.count("\n") == 1
    code, _, err = run(capsys, aws_env, "get", "c1", "--stack", stacks["stateful"])
    assert code == 1 and "has no API endpoint output: name the service stack (wsfleet-<env>-service)" in err
    assert stack_outputs.API_URL in err and err.count("\n") == 1
    code, _, err = run(capsys, aws_env, "status", "--stack", "nope")
    assert code == 1 and err == "wsfleet: stack nope does not exist in us-east-1.\n"


# --- the command ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_python_dash_m_wsfleet_fails_with_a_sentence_and_no_traceback(python_env):
    result = subprocess.run(
        [sys.executable, "-m", "wsfleet", "status"], env=python_env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("wsfleet: ") and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.slow
def test_pip_install_of_runtime_gives_the_package_and_the_wsfleet_command(tmp_path):
    # A copy, so the build's own files never land in the work tree.
    source = tmp_path / "runtime"
    shutil.copytree(RUNTIME, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # The test environment's packages (pip, setuptools, boto3, ...) under the new venv's own.
    Path(site, "parent.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", str(source)],
        check=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )

    result = subprocess.run(
        [venv / "bin" / "wsfleet", "--help"], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=30
    )
    assert result.returncode == 0, result.stderr
    for command in ("start", "stop", "get", "status", "connections", "messages"):
        assert re.search(rf"^\s+{command}\b", result.stdout, re.MULTILINE)
    where = subprocess.run(
        [python, "-c", "import wsfleet.cli; print(wsfleet.cli.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert where.stdout.strip().startswith(site), where.stdout


def pins(path: Path) -> dict[str, str]:
    """name -> version of a requirements file's ``name==version`` lines (extras dropped)."""
    found = {}
    for line in path.read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep:
            found[name.split("[")[0].lower()] = version
    return found


def test_the_clis_requirements_are_boto3_at_the_fleets_pins_and_pyyaml_and_nothing_of_the_workers():
    cli, fleet = pins(RUNTIME / "requirements-cli.txt"), pins(RUNTIME / "requirements.txt")
    assert set(cli) == {"boto3", "botocore", "pyyaml"}
    assert {name: cli[name] for name in ("boto3", "botocore")} == {name: fleet[name] for name in ("boto3", "botocore")}
    assert pins(RUNTIME.parent / "requirements-dev.txt").get("pyyaml") in (None, cli["pyyaml"])


# Every CLI module imported, and a command run, with the worker's libraries unimportable: what
# `pip install ./runtime[cli]` leaves out.
WITHOUT_WORKER_LIBRARIES = """
import importlib, pkgutil, sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("websockets", "opentelemetry", "aws_xray_sdk"):
            raise ImportError(f"{name} is the worker's")
sys.meta_path.insert(0, Refuse())
import wsfleet.cli
for module in pkgutil.iter_modules(wsfleet.cli.__path__):
    importlib.import_module(f"wsfleet.cli.{module.name}")
sys.exit(wsfleet.cli.main(["plan", "--connections", "1000", "--json"], env={}))
"""


@pytest.mark.slow
def test_the_cli_runs_without_the_workers_libraries(python_env):
    result = subprocess.run([sys.executable, "-c", WITHOUT_WORKER_LIBRARIES], env=python_env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["workers"] > 0


# --- plan --------------------------------------------------------------------------------


def test_plan_sizes_a_fleet_from_the_measured_counts_without_any_aws_call(capsys):
    from wsfleet.plan import corrections, environments, fleet, model

    assert main(["plan", "--connections", "100000", "--rate", "0.5", "--env", "prod", "--json"], env={}) == 0
    out = json.loads(capsys.readouterr().out)
    measured = model.load_measured()
    assert environments.load("prod")["target_per_worker"] == 1690  # 100,000 / 1,690 -> 60 workers
    expected = fleet.plan(measured, connections=100_000, per_worker=1690, rate=0.5, shards=16, checkpoint_s=120)
    assert out["holding"]["workers"] == 60 == expected["holding"]["workers"]
    assert out["holding"]["month"]["total"] == pytest.approx(expected["holding"]["month"]["total"])
    # Renewals: one write per worker per heartbeat, whatever the connections.
    # Renewals, plus the summarizer's #fleet writes (one worker for the fleet).
    renewal = next(op for op in measured.ops if op.purpose == "renewal")
    summary = next(op for op in corrections.corrected_ops(measured, 60) if op.purpose == "summary: #fleet write")
    assert out["holding"]["tables"]["sessions"]["wru"] == pytest.approx(
        60 * renewal.per_worker_hour * renewal.wru / 3600 + summary.per_worker_hour * summary.wru / 3600
    )
    # A checkpoint is a transactional write: twice the item's units.
    assert out["with_messages"]["tables"]["messages"]["wru"] == pytest.approx(
        100_000 * 0.5 * measured.message_wru + 100_000 * 2 * measured.checkpoint_wru / 120
    )
    assert out["workers"] == 60 and out["limits"] and "usd_per_month" in out and "first_limit" in out
    assert out["measured_with"]["commit"]


def test_plan_in_tables_names_the_limit_that_binds_first_and_where_its_figures_come_from(capsys):
    assert main(["plan", "--connections", "10000"], env={}) == 0
    out = capsys.readouterr().out
    assert "10,000 connections, 70 per worker (dev): 143 workers" in out
    assert "binds first:" in out and "from the counts measured by" in out


def test_plan_prints_one_monthly_total_and_numbers_as_people_read_them(capsys):
    assert main(["plan", "--connections", "50000", "--rate", "0.5"], env={}) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"^\$ per month", out, re.MULTILINE)) == 1 and "$ per month, the whole fleet: " in out
    assert not re.search(r"\d[eE][+-]\d", out)  # 2.5e+04
    assert re.search(r"max_workers \(the service's scaling ceiling\)\s+715\s+4\s+OVER", out)  # not 4.0
    assert "--out " not in out  # the benchmark's scratch directory


def test_plan_refuses_more_per_worker_than_the_environment_allows(capsys):
    assert main(["plan", "--connections", "100", "--per-worker", "500"], env={}) == 1
    assert capsys.readouterr().err.strip() == "wsfleet: --per-worker 500 is above dev's MAX_CONNECTIONS (100)."


def test_plan_prices_a_large_frame_through_s3_against_inline_where_an_item_can_hold_it(capsys):
    from wsfleet.plan import model as plan

    argv = ["plan", "--connections", "1000", "--env", "prod", "--large-rate", "0.01", "--large-bytes", "2000000", "--json"]
    assert main(argv, env={}) == 0
    out = json.loads(capsys.readouterr().out)
    by_size = {c["bytes"]: c for c in out["large_frame_cost"]}
    assert set(by_size) == {350_000, 1 << 20, 2_000_000, 32 << 20}
    wru = plan.load_measured().prices["dynamodb_wru_per_million"]
    small, big = by_size[350_000], by_size[32 << 20]
    # Per million frames: a PUT is $5, the pointer item one write unit; inline, the item's
    # 342 write units (1 KB each). Storage for prod's 30 days of retention.
    assert small["per_million_s3"]["put"] == pytest.approx(5.0)
    assert small["per_million_s3"]["pointer_item"] == pytest.approx(wru)
    assert small["per_million_inline"]["write"] == pytest.approx(342 * wru)
    assert small["per_million_s3"]["storage"] == pytest.approx(350_000 / 1e9 * 0.023 * 30 / (730 / 24) * 1e6)
    assert big["per_million_inline"] is None  # no item holds 32 MiB
    month = out["large_frames"]
    assert month["puts_per_second"] == pytest.approx(10.0)
    assert month["frames_per_month"] == pytest.approx(10.0 * 3600 * 730)
    assert month["dollars_s3"] == pytest.approx(month["frames_per_month"] / 1e6 * by_size[2_000_000]["per_million_s3"]["total"])


def test_plan_in_tables_shows_what_a_large_frame_costs(capsys):
    assert main(["plan", "--connections", "1000"], env={}) == 0
    out = capsys.readouterr().out
    assert "$ per million large frames (kept 3 days" in out
    assert "32 MiB" in out and "over the 400 KB item limit" in out


# --- the command line itself ----------------------------------------------------------------


def test_version_prints_the_packages_version(capsys):
    from wsfleet import __version__

    assert main(["--version"], env={}) == 0
    assert capsys.readouterr().out.strip() == f"wsfleet {__version__}"


@pytest.mark.parametrize("flag", ["--connections", "--per-worker", "--secrets"])
def test_a_number_flag_given_letters_says_so_in_words(capsys, flag):
    argv = ["plan", "--connections", "1000", flag, "abc"] if flag != "--connections" else ["plan", flag, "abc"]
    assert main(argv, env={}) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be a whole number, got 'abc'" in err and "_" + "positive" not in err


def test_output_json_is_the_same_as_json_and_disagreeing_flags_are_refused(capsys):
    assert main(["plan", "--connections", "1000", "--output", "json"], env={}) == 0
    assert json.loads(capsys.readouterr().out)["env"] == "dev"
    assert main(["plan", "--connections", "1000", "--json", "--output", "text"], env={}) == 2
    assert "disagree" in capsys.readouterr().err


def test_plan_refuses_a_region_whose_prices_it_does_not_carry(capsys):
    assert main(["plan", "--connections", "1000", "--region", "eu-west-1"], env={}) == 1
    assert "--region eu-west-1: the plan carries us-east-1's list prices only" in capsys.readouterr().err
    assert main(["plan", "--connections", "1000", "--region", "us-east-1", "--json"], env={}) == 0


def test_tables_out_of_reach_are_one_sentence_in_seconds_not_a_silent_minute(capsys, aws_env):
    began = time.monotonic()
    code, out, err = run(capsys, {**aws_env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, "status")
    assert code == 1 and "Could not connect to the endpoint URL" in err and "Traceback" not in err
    assert "check the region (--region, AWS_REGION), AWS_ENDPOINT_URL if set, and the network" in err
    assert time.monotonic() - began < 30  # refused at once; retried twice at most, not botocore's default
