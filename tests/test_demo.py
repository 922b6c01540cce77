"""``python -m sim.demo`` as a user runs it, and the report it is judged by."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from sim import report, traces
from sim.demo.cli import parse_args
from sim.observed import Audit, ConnState, LargeFrame, Sample, SessionState, state_from_item
from sim.processes import eventually
from sim.upstream import Overlap, SocketRecord

SVG = "{http://www.w3.org/2000/svg}"

FAST = ["--lease", "3", "--heartbeat", "0.75", "--reconcile", "1", "--skew-ms", "200", "--checkpoint", "1", "--rate", "5"]


def demo(args: list[str], env: dict[str, str], out: Path) -> subprocess.Popen:
    with open(out, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "sim.demo", *args], env=env, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=as_a_terminal_starts_it,
        )


def as_a_terminal_starts_it() -> None:
    """The demo as a terminal runs it, in the foreground: SIGINT at its default. A shell
    without job control starts background commands with SIGINT ignored (`make test &`,
    a CI step run in the background), every process below inherits that, and Python
    leaves a SIGINT it started with ignored ignored: the Ctrl-C test would then send a
    signal the demo never sees."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def children_of(pid: int) -> dict[int, str]:
    """Every descendant process of ``pid``: pid -> its start time (to tell a reused pid)."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = (int(fields[1]), fields[19])
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, started) in parents.items():
            if ppid == parent and child not in found:
                found[child] = started
                frontier.append(child)
    return found


def still_running(pid: int, started: str) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == started and fields[0] != "Z"


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_demo_plays_the_full_scenario_and_passes_its_own_audit(python_env, tmp_path):
    out = tmp_path / "out.txt"
    proc = demo(["--workers", "2", "--connections", "6", "--duration", "16", "--run-dir", str(tmp_path), *FAST], python_env, out)
    status = proc.wait(timeout=140)
    text = out.read_text()

    assert status == 0, text
    for label in ("START 6", "crash: kill -9", "deploy: SIGTERM", "STOP", "START burst", "scale-out: w4 joins"):
        assert label in text
    assert "PASSED" in text and "missing seqs (gaps): 0" in text
    assert "START hints in the dead-letter queue (received 5 times, never deleted): 0" in text
    assert "large frame: c001" in text and "matches what the upstream sent" in text
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    result = json.loads((run_dir / "report.json").read_text())
    assert result["passed"] and result["data"]["missing"] == 0 and result["overlaps"] == []
    large = result["large_frame"]
    assert large["ok"] and large["stored"] == "object" and large["read_bytes"] == large["sent_bytes"] > 3 * 2**20
    assert [e["kind"] for e in result["events"]] == ["start", "start", "crash", "deploy", "stop", "start", "join"]
    assert all(not e["pending"] for e in result["events"])
    # One connection per upstream kind, each audited against the upstream's books; the
    # one without replay lived through the crash of its owner with one marker for it.
    kinds = {k["connection_id"]: k for k in result["upstream_kinds"]}
    assert set(kinds) == {"k-auth", "k-subscribe", "k-flat", "k-none", "k-text", "k-binary"}
    assert all(k["ok"] and k["checkpoint"] > 0 for k in kinds.values()), kinds
    assert "rotated the k-auth credential" in text and "secret values found in none of" in text
    assert kinds["k-none"]["gaps"] and all(g["marker"] is not None for g in kinds["k-none"]["gaps"])
    assert "after kill -9 of" in text
    assert {"w1.log", "w2.log", "w3.log", "w4.log", "report.txt"} <= {p.name for p in run_dir.iterdir()}
    # The run's pictures: a lane for every connection the audit read, each crash and deploy a band.
    assert f"pictures (open in a browser, no network needed): {run_dir / 'report.html'}" in text
    page = ET.fromstring((run_dir / "report.html").read_text())
    lanes = {g.get("data-connection") for g in page.iter(f"{SVG}g") if g.get("class") == "lane"}
    assert {a["connection_id"] for a in result["connections"]} <= lanes
    bands = [t.text for t in page.iter(f"{SVG}title") if t.text and t.text.startswith(("crash", "deploy"))]
    assert len(bands) == 4  # each in the lanes and in the load chart


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["ctrl-c", "sigterm", "sigkill"])
def test_stopping_the_demo_leaves_no_process_behind(python_env, tmp_path, signum):
    out = tmp_path / "out.txt"
    proc = demo(["--workers", "2", "--connections", "4", "--scenario", "steady", "--duration", "60", "--run-dir", str(tmp_path), *FAST], python_env, out)
    try:
        eventually(lambda: "EVENT START" in out.read_text() or proc.poll() is not None, 45, "the fleet to be up")
        children = children_of(proc.pid)
        assert len(children) >= 3, (children, out.read_text())  # the emulator and two workers at least

        proc.send_signal(signum)
        status = proc.wait(timeout=30)
        eventually(lambda: not any(still_running(p, s) for p, s in children.items()), 10, "every child to exit")
    finally:
        if proc.poll() is None:
            proc.kill()
    # Ctrl-C and SIGTERM tear down in order; after SIGKILL the kernel kills the children.
    assert status == {signal.SIGINT: 130, signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGKILL: -signal.SIGKILL}[signum]


# --- the report, from hand-made books -----------------------------------------------------------


def socket(stream: str, opened: float, closed: float | None = None) -> SocketRecord:
    return SocketRecord(id=int(opened * 10), stream=stream, peer="127.0.0.1:1", path="/", from_seq=1, opened_at=opened, closed_at=closed)


def sample(t: float, **owners: str) -> Sample:
    conns = {
        cid: ConnState("STARTED", owner, f"{owner}#1" if owner else "", int((t + 5) * 1000) if owner else 0, 1, 0)
        for cid, owner in owners.items()
    }
    return Sample(t=t, connections=conns, open_sockets={}, produced=0, frames_sent=0)


def test_the_observer_counts_a_connection_owned_only_while_its_session_is_live_and_unexpired():
    sessions = {
        "w1#a": SessionState("w1", "LIVE", expires_at_ms=10_000),
        "w2#b": SessionState("w2", "ENDED", expires_at_ms=10_000, ended_by="w1#a"),
    }

    def owner(session: str, desired: str = "STARTED") -> str:
        item = {"desired_state": desired, "lease_owner": session.split("#")[0], "lease_session": session, "fence_token": 1}
        connections = {"c": state_from_item(item, sessions)}
        return Sample(t=9.0, connections=connections, open_sockets={}, produced=0, frames_sent=0).owners().get("c", "-")

    assert owner("w1#a") == "w1"
    assert owner("w2#b") == ""  # attached to an ENDED session: an orphan until taken
    assert owner("w3#gone") == ""  # a session the observer has not seen
    assert owner("w1#a", "STOPPED") == "-"  # only STARTED connections are counted
    # handed off by its LIVE session and not taken yet: nobody holds its socket (as GET says)
    handed = {"desired_state": "STARTED", "lease_owner": "w1", "lease_session": "w1#a", "fence_token": 3, "released_fence": 3}
    assert state_from_item(handed, sessions).owned_at(9_000) == ""
    assert state_from_item({"lease_owner": "w1", "lease_session": "w1#a"}, sessions).owned_at(10_000) == ""  # expired


def test_a_takeover_is_timed_to_the_first_socket_opened_after_the_event_and_names_the_successor():
    event = report.Event(report.CRASH, "kill -9 w1", 100.0, {"a": 100.0, "b": 100.0}, bound_s=5.0, victim="w1")
    sockets = {"a": [socket("a", 90.0, 100.0), socket("a", 104.0), socket("a", 106.0)], "b": [socket("b", 90.0, 100.0)]}
    outcome = report.measure(event, sockets, [sample(99.0, a="w1", b="w1"), sample(104.5, a="w2", b="")])

    assert outcome.took_s == {"a": 4.0, "b": None}
    assert outcome.successors == {"a": "w2"}
    assert outcome.pending == ["b"] and not outcome.within_bound


def test_a_stop_is_done_when_the_socket_open_at_the_stop_has_closed():
    event = report.Event(report.STOP, "STOP 2", 100.0, {"a": 100.0, "b": 100.5}, bound_s=2.0)
    sockets = {"a": [socket("a", 90.0, 101.2)], "b": [socket("b", 90.0)]}
    outcome = report.measure(event, sockets, [])

    assert outcome.took_s["a"] == pytest.approx(1.2) and outcome.took_s["b"] is None


def test_a_join_counts_as_moved_only_the_connections_whose_socket_was_replaced_within_its_step():
    event = report.Event(report.JOIN, "scale-out: w3 joins", 100.0, {"a": 100.0, "b": 100.0, "c": 100.0}, bound_s=2.0, until=150.0)
    sockets = {
        "a": [socket("a", 90.0, 120.0), socket("a", 120.4)],  # moved: 0.4 s without a socket
        "b": [socket("b", 90.0)],  # stayed
        "c": [socket("c", 90.0, 155.0), socket("c", 156.0)],  # after the step: not this join's
    }
    outcome = report.measure(event, sockets, [sample(110.0, a="w1", b="w1", c="w1"), sample(121.0, a="w3", b="w1", c="w1")])

    assert outcome.took_s == {"a": pytest.approx(0.4)} and outcome.successors == {"a": "w3"}
    assert outcome.pending == [] and outcome.within_bound


def test_the_spread_after_a_fleet_change_is_judged_by_the_fleets_own_rebalancing_rule():
    assert report.above_share({"w1": 10, "w2": 10, "w3": 10, "w4": 6}) == []  # share 9, band 1: nobody sheds
    assert report.above_share({"w1": 15, "w2": 9, "w3": 9, "w4": 3}) == ["w1"]
    join = report.Event(report.JOIN, "scale-out: w3 joins", 10.0, {}, until=None)
    samples = [sample(9.0, a="w1", b="w1", c="w1", d="w2"), sample(20.0, a="w3", b="w1", c="w1", d="w2")]

    lines = report.spread_lines([join], samples, ["w1", "w2", "w3"], ended_at=30.0, t_origin=0.0)

    assert "w1:3 w2:1" in lines[1] and "w1:2 w2:1 w3:1" in lines[2] and "NOT balanced" not in lines[2]


def test_only_an_overlap_during_a_pause_on_a_paused_stream_is_excused():
    pause = report.Event(report.PAUSE, "SIGSTOP w1", 100.0, {"a": 100.0}, victim="w1", until=106.0)
    during = Overlap("a", 104.0, (1, 2), ("p1", "p2"))
    other_stream = Overlap("b", 104.0, (3, 4), ("p1", "p2"))
    after = Overlap("a", 107.0, (5, 6), ("p1", "p2"))

    assert report.excused(during, [pause]) is pause
    assert report.excused(other_stream, [pause]) is None
    assert report.excused(after, [pause]) is None


def test_a_gap_in_the_messages_or_an_unexplained_overlap_fails_the_run():
    clean = Audit("a", rows=5, first=1, last=5, checkpoint=5, produced=9, delivered=5)
    gap = Audit("b", rows=4, first=1, last=5, checkpoint=5, produced=9, delivered=5, missing=[3])

    assert report.failures([], report.summarise([clean], 5), [], strict=False) == []
    assert report.failures([], report.summarise([clean, gap], 10), [], strict=False)
    assert report.failures([], report.summarise([clean], 5), [Overlap("a", 1.0, (1, 2), ("p", "q"))], strict=False)


def test_a_large_frame_read_back_other_than_sent_fails_the_run():
    sent = dict(connection_id="c001", seq=7, sent_bytes=100, sent_sha256="ab" * 32)
    good = LargeFrame(**sent, stored="object", data_ref="s3://b/messages/c001/7", item_bytes=100,
                      item_sha256="ab" * 32, read_bytes=100, read_sha256="ab" * 32)
    assert good.ok and "matches what the upstream sent" in report.large_frame_lines(good)[1]
    assert report.failures([], report.summarise([], 0), [], strict=False, large=good) == []
    for bad in (replace(good, read_sha256="cd" * 32), replace(good, read_bytes=99, item_bytes=99),
                replace(good, stored="marker"), replace(good, stored="absent")):
        assert not bad.ok and report.failures([], report.summarise([], 0), [], strict=False, large=bad)


def test_the_chart_draws_one_row_per_worker_with_its_connections_over_time():
    samples = [sample(float(t), a="w1", b="w1" if t < 5 else "w2") for t in range(10)]
    lines = report.ownership_chart(samples, ["w1", "w2"], [], t_origin=0.0, width=10, ramp=" .:#")

    rows = {line.split("|")[0].strip(): line.split("|")[1] for line in lines[1:3]}
    assert rows == {"w1": "#####:::::", "w2": "     :::::"}


def test_the_chaos_scenario_is_offered_and_needs_a_second_worker_to_take_over():
    args = parse_args(["--scenario", "chaos", "--seed", "7", "--workers", "2"])
    assert (args.scenario, args.seed) == ("chaos", 7)
    with pytest.raises(SystemExit):
        parse_args(["--scenario", "chaos", "--workers", "1"])


def test_the_sink_comes_from_the_flag_or_sink_in_the_environment_and_a_bad_one_is_refused(monkeypatch, capsys):
    monkeypatch.delenv("SINK", raising=False)
    assert parse_args([]).sink == "dynamodb"
    assert parse_args(["--sink", "kinesis,dynamodb"]).sink == "dynamodb,kinesis"
    monkeypatch.setenv("SINK", "kinesis")
    assert parse_args([]).sink == "kinesis"
    with pytest.raises(SystemExit):
        parse_args(["--sink", "kafka"])
    assert "SINK must be one or more of dynamodb, kinesis, firehose" in capsys.readouterr().err


def test_chaos_deals_kinesis_faults_only_with_a_stream_to_fault(monkeypatch, capsys):
    from sim.chaos.__main__ import parse_args as chaos_args

    monkeypatch.delenv("SINK", raising=False)
    assert chaos_args(["--sink", "kinesis", "--kinds", "kinesis_refuse,kill"]).sink == "kinesis"
    with pytest.raises(SystemExit):
        chaos_args(["--kinds", "kinesis_refuse"])
    assert "need a sink with kinesis" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_the_demo_with_tracing_writes_every_processs_spans_as_one_trace_per_start(python_env, tmp_path):
    out = tmp_path / "out.txt"
    args = ["--scenario", "steady", "--workers", "1", "--connections", "1", "--no-kinds", "--duration", "1"]
    proc = demo([*args, "--tracing", "otel", "--run-dir", str(tmp_path), *FAST], python_env, out)
    status = proc.wait(timeout=80)
    text = out.read_text()
    assert status == 0, text
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert {"traces-api.jsonl", "traces-w1.jsonl"} <= {p.name for p in run_dir.iterdir()}
    spans = traces.read(run_dir)
    (start,) = [t for t, members in traces.by_trace(spans).items() if any(s.name == "router" for s in members)
                and any(s.name == "connect" for s in members)]
    assert f"a router trace: python -m sim.traces {run_dir} {start}" in text
    lines = traces.tree(traces.by_trace(spans)[start])
    assert [line.split()[0] for line in lines if "." not in line.split()[0]] == ["router", "acquire", "connect"]
    assert lines[0].startswith("router [wsfleet-router]") and "connection_id=c001" in lines[0]
    assert any(line.startswith("  acquire [wsfleet-worker]") and "source=hint" in line for line in lines)
    # The worker's log lines under those spans carry the same trace id.
    logged = [json.loads(line) for line in (run_dir / "w1.log").read_text().splitlines() if line.startswith("{")]
    assert any(e.get("event") == "lease_acquired" and e.get("trace_id") == start for e in logged)
