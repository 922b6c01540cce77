"""``wsfleet messages`` (``wsfleet.cli.reading``): a connection's stored messages through
the router behind the local API, page after page, followed like ``tail -f``, large data
fetched from its presigned URL and checked; items written in the shape CONTRACT.md
section 4 gives them."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import threading
from typing import Any, Callable

import pytest

from tests import test_cli
from sim.api import LocalApi
from wsfleet.logs import JsonLogger
from wsfleet.router import Router
from tests.test_cli import URL, run
from tests.test_router_messages import Stored
from wsfleet import schema
from wsfleet.cli import reading, render
from wsfleet.cli.api import ApiClient
from wsfleet.cli.errors import CliError
from sim.emulator import set_faults
from wsfleet.store import ConnectionsStore
from wsfleet.stream import Frame

pytestmark = pytest.mark.timeout(120)

api = test_cli.api  # the fixture: the router behind the local API


@pytest.fixture
def stored(ddb, aws_env, emulator) -> Stored:
    return Stored(ddb, aws_env, emulator)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_messages_reads_pages_through_the_api_from_a_seq(capsys, aws_env, api, stored, monkeypatch):
    run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url)
    stored.inline("c1", range(1, 31))
    monkeypatch.setattr(reading, "MAX_PAGE", 7)  # several pages for one command

    code, out, err = run(capsys, aws_env, "messages", "c1", "--api", api.url, "--from-seq", "5", "--limit", "12", "--json")
    assert (code, err) == (0, "")
    assert json_lines(out) == [{"seq": s, "data": {"v": s}} for s in range(5, 17)]

    assert [e["seq"] for e in json_lines(run(capsys, aws_env, "messages", "c1", "--api", api.url, "--json")[1])] == list(
        range(1, 21)
    )  # 20 without --limit
    code, out, _ = run(capsys, aws_env, "messages", "c1", "--api", api.url, "--limit", "2")
    assert (code, out) == (0, '1  {"v":1}\n2  {"v":2}\n')
    assert run(capsys, aws_env, "messages", "c1", "--api", api.url, "--from-seq", "31")[1] == (
        "no messages stored for c1 from seq 31\n"
    )
    assert run(capsys, aws_env, "messages", "c1", "--api", api.url, "--limit", "0")[0] == 2
    assert run(capsys, aws_env, "messages", "c1", "--api", api.url, "--from-seq", "-1")[0] == 2


def test_messages_shows_markers_and_large_data_and_fetches_it_with_follow_urls(capsys, aws_env, api, stored, emulator):
    run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url)
    big = json.dumps({"text": "ü" * 400_000}, ensure_ascii=False).encode()
    stored.inline("c1", [1, 9])
    stored.marker("c1", 2, "over_frame_limit", **{schema.DATA_BYTES: 40_000_000})
    stored.marker("c1", 3, "upstream_gap", **{schema.SKIP_TO: 6})
    stored.marker("c1", 7, "malformed")
    stored.large("c1", 8, big)

    code, out, _ = run(capsys, aws_env, "messages", "c1", "--api", api.url)
    assert code == 0 and out.splitlines() == [
        '1  {"v":1}',
        "2  (skipped: over_frame_limit, 40,000,000 bytes)",
        "3  (skipped: upstream_gap, seqs 3-6)",
        "7  (skipped: malformed)",
        f"8  (large data: {len(big):,} bytes at its data_url; --follow-urls fetches it)",
        '9  {"v":9}',
    ]
    entries = json_lines(run(capsys, aws_env, "messages", "c1", "--api", api.url, "--json")[1])
    assert entries[4]["data_url"].startswith(emulator.endpoint_url) and entries[2]["to_seq"] == 6

    code, out, err = run(capsys, aws_env, "messages", "c1", "--api", api.url, "--json", "--follow-urls")
    assert (code, err) == (0, "")
    assert json_lines(out)[4] == {"seq": 8, "data": {"text": "ü" * 400_000}}
    code, out, _ = run(capsys, aws_env, "messages", "c1", "--api", api.url, "--follow-urls", "--from-seq", "8")
    assert out.splitlines()[0].startswith('8  {"text":"üüü') and len(out.splitlines()[0]) == 3 + render.MESSAGE_WIDTH


def test_messages_prints_a_binary_feeds_frames_as_bytes_and_its_large_one_fetched_as_data_base64(capsys, aws_env, api, stored):
    run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url)
    small, large = b"\x00\x01\xff", bytes(range(256)) * 1200
    stored.store.put("c1", [Frame(1, json.dumps(base64.b64encode(small).decode()), 1, binary=True)], fence_token=1, worker_id="w1")
    as_stored = json.dumps(base64.b64encode(large).decode()).encode()  # the object: the base64 as a JSON string
    stored.large("c1", 2, as_stored, **{schema.DATA_FORMAT: schema.DATA_FORMAT_BINARY})
    code, out, _ = run(capsys, aws_env, "messages", "c1", "--api", api.url)
    assert code == 0 and out.splitlines()[0] == "1  (3 bytes) 00 01 ff"
    code, out, _ = run(capsys, aws_env, "messages", "c1", "--api", api.url, "--json", "--follow-urls")
    assert [base64.b64decode(e["data_base64"]) for e in json_lines(out)] == [small, large]


def test_follow_urls_refuses_data_that_does_not_match_its_hash(capsys, aws_env, api, stored):
    run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url)
    stored.large("c1", 1, b'{"a":1}')
    stored.s3.put_object(Bucket=aws_env["MESSAGES_BUCKET_NAME"], Key=schema.message_object_key("c1", 1), Body=b'{"a":2}')

    code, out, err = run(capsys, aws_env, "messages", "c1", "--api", api.url, "--follow-urls")
    assert (code, out) == (1, "")
    assert err.startswith("wsfleet: seq 1: the data fetched (7 bytes") and "does not match" in err
    assert err.count("\n") == 1


def test_follow_urls_names_the_seq_whose_object_is_missing(capsys, aws_env, api, stored):
    run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url)
    key = schema.message_object_key("c1", 4)  # an item whose object was never written
    ref = {schema.DATA_REF: schema.data_ref(aws_env["MESSAGES_BUCKET_NAME"], key), schema.DATA_BYTES: 9}
    stored.item("c1", 4, **ref, **{schema.DATA_SHA256: "0" * 64})

    code, out, err = run(capsys, aws_env, "messages", "c1", "--api", api.url, "--follow-urls")
    assert (code, out, err) == (1, "", "wsfleet: seq 4: fetching its data_url answered HTTP 404.\n")


@pytest.mark.parametrize(
    "argv, sentence",
    [
        (("messages", "nope"), "No connection nope is known; START it first (HTTP 404)."),
        (("messages", "bad id"), "connection_id must be 1 to 128 characters"),
        (("messages", "c1", "--from-seq", str(2**63)), None),
    ],
)
def test_messages_errors_are_one_sentence_and_a_non_zero_exit(capsys, aws_env, api, argv, sentence):
    run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url)
    code, out, err = run(capsys, aws_env, *argv, "--api", api.url)
    if sentence is None:  # refused before any request: a usage error
        assert code == 2 and "--from-seq: must be a seq from 0 to" in err
        return
    assert (code, out) == (1, "")
    assert err.startswith("wsfleet: ") and sentence in err and err.count("\n") == 1


@pytest.mark.parametrize("follow", [(), ("--follow",)])
def test_messages_of_a_fleet_that_stores_frames_only_on_its_stream_is_the_apis_sentence(capsys, aws_env, follow):
    env = {**aws_env, "ALLOWED_WS_HOSTS": "127.0.0.1", "SINK": "kinesis", "MESSAGES_STREAM_NAME": "wsfleet-dev-messages"}
    router = Router.from_env(env, logger=JsonLogger(io.StringIO(), component="router"))
    with LocalApi(router.handle) as kinesis_api:
        run(capsys, aws_env, "start", "c1", URL + "c1", "--api", kinesis_api.url)
        code, out, err = run(capsys, aws_env, "messages", "c1", "--api", kinesis_api.url, *follow)
    assert (code, out) == (1, "")  # as for any 4xx, and --follow does not wait it out
    assert err.startswith("wsfleet: This fleet sends frames to the Kinesis stream wsfleet-dev-messages")
    assert "SINK to include dynamodb" in err and err.endswith("(HTTP 409).\n") and err.count("\n") == 1


def test_messages_from_an_api_out_of_reach_is_one_sentence(capsys, aws_env):
    code, out, err = run(capsys, aws_env, "messages", "c1", "--api", "http://127.0.0.1:9")
    assert (code, out) == (1, "")
    assert err.startswith("wsfleet: cannot reach the API at http://127.0.0.1:9/connections/c1/messages?after_seq=-1")


def follow_polls(client: ApiClient, step: Callable[[int, float], None], **kwargs: Any) -> list[list[int]]:
    """Follows "c1" in process, the pauses between polls being the moments things happen:
    at the n-th pause, ``step(n, seconds)`` runs, and ends the follow by raising
    KeyboardInterrupt. What had been shown at each pause, in order."""
    shown: list[int] = []
    polls: list[list[int]] = []

    def pause(seconds: float) -> None:
        polls.append(list(shown))
        step(len(polls), seconds)

    with pytest.raises(KeyboardInterrupt):
        reading.read(
            client, "c1", after_seq=-1, limit=None, show=lambda e: shown.append(e["seq"]), follow=True, sleep=pause,
            **kwargs,
        )
    return polls


def test_follow_polls_past_the_end_and_shows_what_arrives(ddb, aws_env, api, stored):
    """In process, with the pauses between polls as the moments things happen."""
    ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4).start("c1", URL + "c1")
    stored.inline("c1", [1, 2])

    def step(n: int, seconds: float) -> None:
        assert seconds == 0.5
        if n == 1:
            stored.inline("c1", [3, 4])
        elif n == 2:
            raise KeyboardInterrupt

    polls = follow_polls(ApiClient(api.url), step, interval=0.5)
    assert polls == [[1, 2], [1, 2, 3, 4]]


def test_follow_waits_for_a_hole_at_the_end_and_then_moves_past_it(ddb, aws_env, api, stored):
    ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4).start("c1", URL + "c1")
    stored.inline("c1", [1, 2, 4])
    stored.marker("c1", 5, "upstream_gap", **{schema.SKIP_TO: 7})
    stored.inline("c1", [8])

    def step(n: int, _: float) -> None:
        if n == 2:
            stored.inline("c1", [3])  # the write in flight lands
        if n == 3:
            stored.inline("c1", [10])  # a hole that is never filled
        if n == 4 + reading.HOLE_POLLS:
            raise KeyboardInterrupt

    polls = follow_polls(ApiClient(api.url), step)
    assert polls[:3] == [[1, 2], [1, 2], [1, 2, 3, 4, 5, 8]]  # the range marker covers 5-7
    assert polls[3 : 2 + reading.HOLE_POLLS] == [[1, 2, 3, 4, 5, 8]] * (reading.HOLE_POLLS - 1)
    assert polls[-1] == [1, 2, 3, 4, 5, 8, 10]


def test_follow_rides_out_a_few_failed_polls_and_goes_on(ddb, aws_env, api, stored, emulator):
    ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4).start("c1", URL + "c1")
    stored.inline("c1", [1])

    def step(n: int, _: float) -> None:
        if n == 1:
            set_faults(emulator.endpoint_url, throttle={"Query": 1.0})  # the router answers 503
        elif n == 3:
            set_faults(emulator.endpoint_url)
            stored.inline("c1", [2])
        elif n == 4:
            raise KeyboardInterrupt

    statuses: list[int] = []

    class Recording(ApiClient):
        def messages(self, *args, **kwargs):
            reply = super().messages(*args, **kwargs)
            statuses.append(reply.status)
            return reply

    try:
        polls = follow_polls(Recording(api.url), step)
    finally:
        set_faults(emulator.endpoint_url)
    assert statuses == [200, 503, 503, 200]
    assert polls == [[1], [1], [1], [1, 2]]


def test_follow_gives_up_after_its_retries_with_the_last_failure(aws_env):
    pauses: list[float] = []
    with pytest.raises(CliError, match="cannot reach the API"):
        reading.read(
            ApiClient("http://127.0.0.1:9"), "c1", after_seq=-1, limit=None, show=print,
            follow=True, sleep=pauses.append,
        )
    assert len(pauses) == reading.FOLLOW_RETRIES


def test_follow_stops_at_its_limit(capsys, aws_env, api, stored):
    run(capsys, aws_env, "start", "c1", URL + "c1", "--api", api.url)
    stored.inline("c1", range(1, 6))
    code, out, _ = run(capsys, aws_env, "messages", "c1", "--api", api.url, "--follow", "--limit", "3", "--json")
    assert code == 0 and [e["seq"] for e in json_lines(out)] == [1, 2, 3]


@pytest.mark.slow
def test_the_follow_command_prints_a_message_stored_after_it_started_and_ctrl_c_ends_it_with_0(
    ddb, aws_env, api, stored, python_env
):
    import queue
    import signal

    run_env = {**python_env, "AWS_REGION": aws_env["AWS_REGION"]}
    ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4).start("c1", URL + "c1")
    stored.inline("c1", [1])
    proc = subprocess.Popen(
        [sys.executable, "-m", "wsfleet", "messages", "c1", "--api", api.url, "--follow", "--interval", "0.2"],
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As a terminal's Ctrl-C finds it: a test run started in the background of a
        # non-interactive shell has SIGINT ignored, and children inherit that.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        assert lines.get(timeout=30) == '1  {"v":1}\n'
        stored.inline("c1", [2])
        assert lines.get(timeout=30) == '2  {"v":2}\n'
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- wsfleet records: the messages stream -----------------------------------------------------------


@pytest.fixture
def stream(emulator, aws_env) -> tuple[Any, str]:
    """A messages stream of two shards, and a client of it."""
    import uuid

    import boto3

    kinesis = boto3.client("kinesis", endpoint_url=emulator.endpoint_url, region_name=aws_env["AWS_REGION"])
    name = f"messages-{uuid.uuid4().hex[:8]}"
    kinesis.create_stream(StreamName=name, ShardCount=2)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 300})
    return kinesis, name


def put_frames(kinesis: Any, name: str, cid: str, seqs: Any, fence: int, *, packed: bool = False) -> None:
    """One record per frame, or (``packed``) all of them in one aggregate, as the worker's sink packs them."""
    from wsfleet import aggregation, records
    from wsfleet.stream import Frame

    entries = [
        {"PartitionKey": cid, "Data": records.encode(cid, fence, f"w{fence}", Frame(s, json.dumps({"v": s}), 1_700_000_000_000 + s))}
        for s in seqs
    ]
    if packed:
        entries = [{"PartitionKey": cid, "Data": aggregation.pack(cid, [e["Data"] for e in entries])}]
    kinesis.put_records(StreamName=name, Records=entries)


def test_records_reads_the_connections_shard_and_keeps_the_highest_fence_per_seq(capsys, aws_env, stream):
    kinesis, name = stream
    put_frames(kinesis, name, "c1", range(1, 6), fence=1)
    put_frames(kinesis, name, "c2", range(1, 50), fence=1)  # another connection, maybe on the same shard
    put_frames(kinesis, name, "c1", range(3, 7), fence=2, packed=True)  # a takeover from checkpoint 2, one aggregate
    put_frames(kinesis, name, "c1", [6], fence=1)  # the old owner's late request
    kinesis.put_records(StreamName=name, Records=[{"PartitionKey": "c1", "Data": b"not a record"}])

    code, out, err = run(capsys, aws_env, "records", "c1", "--stream", name, "--json")
    assert (code, err) == (0, "")
    lines = json_lines(out)
    assert [(e["seq"], e["fence_token"]) for e in lines] == [(1, 1), (2, 1), (3, 2), (4, 2), (5, 2), (6, 2)]
    assert lines[0] == {"seq": 1, "fence_token": 1, "worker_id": "w1", "received_at_ms": 1_700_000_000_001, "data": {"v": 1}}

    code, out, _ = run(capsys, aws_env, "records", "c1", "--stream", name, "--from-seq", "5", "--since", "all")
    assert code == 0 and out.splitlines()[:2] == ['5  {"v":5}', '6  {"v":6}']
    assert out.splitlines()[2] == (
        f"c1: 10 records on 1 shard(s) of {name} since its trim horizon; 2 seqs shown, 4 deliveries again dropped "
        "(the highest fence kept), 1 records that are not wsfleet records skipped"
    )


def test_records_finds_the_stream_in_the_stateful_stacks_outputs_or_says_what_is_missing(capsys, aws_env):
    from wsfleet import stack_outputs
    from wsfleet.cli import records

    assert records.stream_of(None, {stack_outputs.MESSAGES_STREAM_NAME: "m"}, "st", {}) == "m"
    assert records.stream_of("given", {stack_outputs.MESSAGES_STREAM_NAME: "m"}, "st", {}) == "given"
    assert records.stream_of(None, None, None, {"MESSAGES_STREAM_NAME": "from-env"}) == "from-env"
    with pytest.raises(CliError, match="stack st has no MessagesStreamName output: name the stateful stack"):
        records.stream_of(None, {stack_outputs.CONNECTIONS_TABLE_NAME: "t"}, "st", {})
    code, out, err = run(capsys, aws_env, "records", "c1")
    assert (code, out) == (1, "") and err.startswith("wsfleet: MESSAGES_STREAM_NAME not set") and err.count("\n") == 1
    code, _, err = run(capsys, aws_env, "records", "c1", "--stream", "s", "--since", "soon")
    assert code == 2 and "--since: must be a duration such as 90s" in err
