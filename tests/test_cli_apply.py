"""``wsfleet apply -f FILE`` against the router behind the local API: only what differs is
sent (a second apply sends nothing), --dry-run shows the diff and sends nothing, a
refused entry is reported with its line and the API's sentence while the others go on,
a bad file is refused whole naming the line and the key, and many entries go in one
command."""

from __future__ import annotations

import json

import pytest

from tests.test_cli import URL, run
from tests.test_cli import api as cli_api
from wsfleet.cli import apply as apply_mod
from wsfleet.cli import desired
from wsfleet.cli.api import ApiClient

api = pytest.fixture(cli_api.__wrapped__, name="api")  # test_cli's: the router behind a LocalApi

FILE = """\
# three connections
- connection_id: c1
  ws_url: {url}c1
  desired: running
- connection_id: c2
  ws_url: {url}c2
  desired: running
  upstream:
    headers: {{X-Feed: prices}}
    resume: query
- connection_id: c3
  ws_url: {url}c3
  desired: stopped
"""


class Counting(ApiClient):
    """The real client, counting the requests that change something."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.writes: list[tuple[str, str]] = []

    def request(self, method, path, payload=None):
        if method != "GET":
            self.writes.append((method, (payload or {}).get("event_type", path)))
        return super().request(method, path, payload)


def write(tmp_path, text: str, name: str = "fleet.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_apply_starts_what_differs_and_applying_again_sends_nothing(capsys, aws_env, api, tmp_path):
    path = write(tmp_path, FILE.format(url=URL))
    run(capsys, aws_env, "start", "c3", URL + "c3", "--api", api.url)  # to be stopped

    code, out, err = run(capsys, aws_env, "apply", "-f", path, "--api", api.url)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"+ c1  create: {URL}c1",
        f"+ c2  create: {URL}c2",
        "- c3  stop: STARTED -> STOPPED",
        f"{path}: 3 connections (applied): 2 create, 0 change, 1 stop, 0 unchanged",
    ]
    got = json.loads(run(capsys, aws_env, "get", "c2", "--api", api.url, "--json")[1])["body"]
    # resume: query is the default: stored (and compared) without it.
    assert got["desired_state"] == "STARTED" and got["upstream"] == {"headers": {"X-Feed": "prices"}}

    client = Counting(api.url)
    entries = desired.read(path)
    outcomes = apply_mod.apply_all(client, entries, dry_run=False)
    assert [o.action for o in outcomes] == ["unchanged"] * 3 and client.writes == []
    code, out, _ = run(capsys, aws_env, "apply", "-f", path, "--api", api.url, "--output", "json")
    assert code == 0 and json.loads(out)["counts"] == {"create": 0, "change": 0, "stop": 0, "unchanged": 3, "failed": 0}


def test_a_changed_url_is_stop_then_start_and_dry_run_only_shows_it(capsys, aws_env, api, tmp_path):
    path = write(tmp_path, FILE.format(url=URL))
    assert run(capsys, aws_env, "apply", "-f", path, "--api", api.url)[0] == 0
    changed = write(tmp_path, FILE.format(url=URL).replace(f"{URL}c1", f"{URL}c1-v2").replace("stopped", "running"),
                    "v2.json.yaml")

    code, out, _ = run(capsys, aws_env, "apply", "-f", changed, "--api", api.url, "--dry-run", "--json")
    plan = json.loads(out)
    assert code == 0 and plan["dry_run"] is True
    assert plan["counts"] == {"create": 1, "change": 1, "stop": 0, "unchanged": 1, "failed": 0}
    by_id = {e["connection_id"]: e for e in plan["entries"]}
    assert by_id["c1"] == {"line": 2, "connection_id": "c1", "action": "change", "status": "planned",
                           "detail": f"ws_url {URL}c1 -> {URL}c1-v2"}
    assert by_id["c3"]["action"] == "create" and by_id["c3"]["line"] == 11
    assert json.loads(run(capsys, aws_env, "get", "c1", "--api", api.url, "--json")[1])["body"]["ws_url"] == URL + "c1"

    client = Counting(api.url)
    apply_mod.apply_all(client, desired.read(changed), dry_run=False)
    assert sorted(client.writes) == [("POST", "START"), ("POST", "START"), ("POST", "STOP")]
    assert json.loads(run(capsys, aws_env, "get", "c1", "--api", api.url, "--json")[1])["body"]["ws_url"] == URL + "c1-v2"


def test_a_refused_entry_is_reported_with_its_line_and_the_others_go_on(capsys, aws_env, api, tmp_path):
    entries = [{"connection_id": f"c{n}", "ws_url": f"{URL}c{n}", "desired": "running"} for n in range(3)]
    entries[1]["ws_url"] = "ws://not-allowed.example.com/x"  # the router's ALLOWED_WS_HOSTS refuses it
    path = write(tmp_path, "[\n" + ",\n".join(json.dumps(e) for e in entries) + "\n]\n", "fleet.json")

    code, out, err = run(capsys, aws_env, "apply", "-f", path, "--api", api.url)
    assert code == 1
    [failed] = [line for line in out.splitlines() if line.startswith("!")]
    assert failed.startswith(f"! c1  {path}:3: create failed: ") and "(HTTP 400)" in failed
    assert err.strip() == f"wsfleet: 1 of 3 connections in {path} failed (each shown with its line)."
    assert json.loads(run(capsys, aws_env, "get", "c2", "--api", api.url, "--json")[1])["status"] == 200


@pytest.mark.parametrize(
    "text, said",
    [
        ("- connection_id: c1\n  ws_url: ws://h/x\n  desired: start\n", "fleet.yaml:1: connection c1: key 'desired' must be running or stopped, got 'start'"),
        ("- connection_id: c1\n  ws_url: ws://h/x\n  desired: on\n", "got True (YAML reads on, yes and true as true: quote it)"),
        ("- connection_id: c1\n  ws_url: ws://h/x\n  desired: running\n- ws_url: ws://h/y\n  desired: running\n",
         "fleet.yaml:4: key 'connection_id' is missing"),
        ("- connection_id: c1\n  ws_url: ws://h/x\n  desired: running\n  resume: sometimes\n", "fleet.yaml:1: connection c1: upstream.resume"),
        ("- connection_id: c1\n  ws_url: ws://h/x\n  desired: running\n  colour: red\n", "fleet.yaml:1: unknown key 'colour'"),
        ("- connection_id: c1\n  ws_url: ws://h/x\n  desired: running\n- connection_id: c1\n  ws_url: ws://h/x\n  desired: running\n",
         "fleet.yaml:4: connection_id c1 is also on line 1"),
        ("- connection_id: c1\n  ws_url: [unclosed\n", "fleet.yaml:3: not valid YAML"),
        ("connections: 3\n", "expected a list of connections"),
    ],
)
def test_a_bad_file_is_refused_whole_naming_the_line_and_the_key(capsys, aws_env, tmp_path, text, said):
    path = write(tmp_path, text)
    # No API is reached: the file is checked before the API is even looked for.
    code, out, err = run(capsys, aws_env, "apply", "-f", path, "--api", "http://127.0.0.1:9")
    assert (code, out) == (1, "")
    assert said in err and "nothing sent" in err and "Traceback" not in err


def test_apply_of_many_connections_in_one_command(capsys, aws_env, api, tmp_path):
    # 100 here (the in-process emulator answers one request at a time); 1,000 timed in the report.
    entries = [{"connection_id": f"k{n:04d}", "ws_url": f"{URL}k{n}", "desired": "running"} for n in range(100)]
    path = write(tmp_path, json.dumps({"connections": entries}, indent=1), "big.json")
    code, out, err = run(capsys, aws_env, "apply", "-f", path, "--api", api.url, "--json")
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert result["counts"]["create"] == 100 and [e["connection_id"] for e in result["entries"]] == sorted(
        e["connection_id"] for e in entries
    )
    code, out, _ = run(capsys, aws_env, "apply", "-f", path, "--api", api.url, "--dry-run")
    assert out.splitlines() == [f"{path}: 100 connections (dry run, nothing sent): 0 create, 0 change, 0 stop, 100 unchanged"]


def test_an_api_out_of_reach_is_one_sentence_not_one_per_entry(capsys, aws_env, tmp_path):
    path = write(tmp_path, FILE.format(url=URL))
    code, out, err = run(capsys, aws_env, "apply", "-f", path, "--api", "http://127.0.0.1:9")
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert err.startswith("wsfleet: GET /connections/c1 failed, so nothing was sent: cannot reach the API at http://127.0.0.1:9")
