"""``python -m wsfleet.worker`` as a real process: start-up errors and SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from sim.upstream import ThreadedUpstream
from wsfleet import schema
from wsfleet.sinks import MessagesStore
from wsfleet.store import ConnectionsStore, SessionsStore

pytestmark = pytest.mark.slow


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_a_bad_setting_stops_the_worker_at_start_up_naming_the_variable(python_env, aws_env):
    env = {**python_env, **aws_env, "LEASE_SECONDS": "twenty"}
    proc = subprocess.run([sys.executable, "-m", "wsfleet.worker"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "LEASE_SECONDS" in proc.stderr and "Traceback" not in proc.stderr
    event = json.loads(proc.stdout.strip().splitlines()[-1])
    assert event["event"] == "config_error" and "LEASE_SECONDS" in event["message"]


def test_sigterm_closes_flushes_and_releases_every_connection_then_hints_peers(python_env, aws_env, ddb, sqs):
    conns = ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4)
    sessions = SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"])
    msgs = MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"])
    ids = [f"s{i}" for i in range(3)]
    env = {
        **python_env,
        **aws_env,
        "WORKER_ID": "proc-1",
        "LEASE_SECONDS": "4",
        "HEARTBEAT_SECONDS": "1",
        "RECONCILE_SECONDS": "0.5",
        "MAX_CLOCK_SKEW_MS": "200",
        "SHUTDOWN_SECONDS": "6",
    }
    with ThreadedUpstream(rate=20.0) as up:
        for cid in ids:
            conns.start(cid, up.url_for(cid))
        proc = subprocess.Popen(
            [sys.executable, "-m", "wsfleet.worker"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            wait_for(
                lambda: all(up.open_sockets(c) for c in ids) and all(len(msgs.read_all(c)) >= 5 for c in ids),
                20,
                "all connected and storing",
            )
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=10)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err
        assert took < 6, took
        assert not any(up.open_sockets(c) for c in ids)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert {e["connection_id"] for e in events if e["event"] == "lease_released"} == set(ids)
    (opened,) = [e["session_id"] for e in events if e["event"] == "session_opened"]
    for cid in ids:
        item = conns.get(cid)
        stored = [r["sk"] for r in msgs.read_all(cid)]
        # Handed off: still STARTED and attached to the session (no FREE# write), released
        # at its fence, for a peer its hint names.
        assert item["lease_session"] == opened and item["released_fence"] == item["fence_token"]
        assert item["owner_key"] == schema.owner_key_session(opened)
        assert item["last_seq"] == stored[-1] and stored == list(range(1, len(stored) + 1))
    # The worker ended its own session once everything was released; nobody took the
    # handoffs, so it stays in the ring for its watchers to drain.
    session = sessions.get(opened)
    assert (session["state"], session["ended_by"]) == ("ENDED", "proc-1") and session["ring"] == schema.RING_VALUE
    hinted: set[str] = set()

    def receive_hints() -> bool:
        for m in sqs.receive_message(QueueUrl=aws_env["QUEUE_URL"], MaxNumberOfMessages=10, WaitTimeSeconds=0).get(
            "Messages", []
        ):
            hinted.add(json.loads(m["Body"])["connection_id"])
        return hinted == set(ids)

    wait_for(receive_hints, 5, "a takeover hint per released connection")
    # Every log line is one JSON event with the worker's id.
    assert all(e.get("worker_id") == "proc-1" for e in events if e["event"] != "config_error")
