"""``wsfleet retry ID`` through the local API: a quarantined connection is STARTed again
with its own ws_url and upstream (the quarantine goes); one not quarantined is left as
it is; a STOPPED or unknown one is one sentence and exit status 1."""

from __future__ import annotations

import json
import re

import pytest

from tests.test_cli import URL, acquire, open_session, run
from tests.test_cli import api as cli_api
from wsfleet import schema
from wsfleet.crash_loop import Suspect
from wsfleet.store import ConnectionsStore

api = pytest.fixture(cli_api.__wrapped__, name="api")  # test_cli's: the router behind a LocalApi

UPSTREAM = {"headers": {"X-Feed": "prices"}, "resume": "open_message", "open_message": "from {from_seq}"}


def quarantined(ddb, aws_env, connection_id: str) -> None:
    session = open_session(ddb, aws_env, "w1")
    acquire(ddb, aws_env, connection_id, session, "w1")
    store = ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4)
    assert store.strike(connection_id, Suspect(connection_id, 1, "w"), dead_session=session, quarantine_after=1)


def test_retry_starts_a_quarantined_connection_again_with_its_own_url_and_upstream(capsys, ddb, aws_env, api):
    code, _, err = run(capsys, aws_env, "start", "c1", URL + "c1", "--header", "X-Feed=prices", "--resume", "open_message",
                       "--open-message", "from {from_seq}", "--api", api.url)
    assert code == 0, err
    quarantined(ddb, aws_env, "c1")
    code, out, _ = run(capsys, aws_env, "get", "c1", "--api", api.url)
    fields = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines()[1:])
    assert fields["quarantined"].startswith("crash_loop: the prime suspect of 1 consecutive")

    code, out, err = run(capsys, aws_env, "retry", "c1", "--api", api.url)
    assert (code, err) == (0, "")
    assert out.startswith("c1: STARTED (restarted), HTTP 202; was quarantined: crash_loop:")
    item = ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4).get("c1")
    assert schema.QUARANTINED not in item and item[schema.UPSTREAM] == UPSTREAM and item[schema.WS_URL] == URL + "c1"

    code, out, _ = run(capsys, aws_env, "retry", "c1", "--api", api.url)
    assert out.strip() == "c1: STARTED (unchanged), HTTP 200; was not quarantined"


def test_retry_of_a_stopped_or_unknown_connection_is_one_sentence(capsys, aws_env, api):
    run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url)
    run(capsys, aws_env, "stop", "c1", "--api", api.url)
    code, out, err = run(capsys, aws_env, "retry", "c1", "--api", api.url)
    assert (code, out) == (1, "") and "c1 is STOPPED: START it to run it again." in err
    code, _, err = run(capsys, aws_env, "retry", "nope", "--api", api.url)
    assert code == 1 and "nope" in err and "\n" == err[-1] and err.count("\n") == 1


def test_status_lists_a_quarantined_connection_with_its_reason_and_not_as_unowned(capsys, ddb, aws_env):
    ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4).start("c1", URL + "c1")
    quarantined(ddb, aws_env, "c1")
    code, out, _ = run(capsys, aws_env, "status")
    assert code == 0 and "STARTED but unowned: 0" in out
    assert "STARTED and quarantined (wsfleet retry ID runs one again): 1" in out and "crash_loop: the prime" in out
    code, out, _ = run(capsys, aws_env, "status", "--json")
    [entry] = json.loads(out)["quarantined"]
    assert entry["connection_id"] == "c1" and entry["reason"].startswith("crash_loop:") and entry["since_s"] >= 0
