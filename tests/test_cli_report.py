"""The operators' pictures: ``wsfleet report`` (a run's logs as one HTML file),
``wsfleet plan --chart`` and ``status --watch``'s redrawing. The run directory is written
here by the worker's own logger, so the lines are the product's format."""

from __future__ import annotations

import gzip
import io
import json
import xml.etree.ElementTree as ET

import pytest

from wsfleet import logs
from wsfleet.cli import main, plan_chart, run_verdicts, timeline, watch
from wsfleet.logs import JsonLogger

SVG = "{http://www.w3.org/2000/svg}"


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def write_run(tmp_path, monkeypatch):
    """Two workers: w1 holds c1 and c2 and is killed at 110 (it logs nothing more);
    w2 holds c3, takes c1 and c2 over at 121 with fence 2, drops a frame of c3 and is
    told to STOP it at 130. A chaos-style report.json: the kill as a fault, two
    invariants (one violated)."""
    clock = Clock(100.0)
    monkeypatch.setattr(logs.time, "time", clock)
    files = {w: open(tmp_path / f"{w}.log", "w") for w in ("w1", "w2")}
    log = {w: JsonLogger(f, worker_id=w) for w, f in files.items()}

    def at(t, worker, level, event, **fields):
        clock.t = t
        getattr(log[worker], level)(event, **fields)

    def hold(t, worker, cid, fence, active, source="hint"):
        at(t, worker, "info", "lease_acquired", connection_id=cid, source=source, fence_token=fence, checkpoint=0,
           from_seq=1, active=active)
        conn = log[worker].bind(connection_id=cid, fence_token=fence)
        clock.t = t + 0.1
        conn.info("connected", from_seq=1, attempt=0)
        return conn

    at(100, "w1", "info", "worker_started", max_connections=100)
    at(100.2, "w2", "info", "worker_started", max_connections=100)
    hold(101, "w1", "c1", 1, 1)
    hold(101.5, "w1", "c2", 1, 2)
    c3 = hold(102, "w2", "c3", 1, 1)
    at(110, "w1", "info", "stats", active=2)  # then kill -9: no connection_ended
    hold(121, "w2", "c1", 2, 2, source="orphan")
    hold(121.2, "w2", "c2", 2, 3, source="orphan")
    clock.t = 125
    c3.error("frame_dropped", seq=7, why="unparseable")
    clock.t = 130
    c3.info("stop_received")
    clock.t = 130.2
    c3.info("socket_closed", aborted=False)
    at(130.3, "w2", "info", "connection_ended", connection_id="c3", why="stopped", active=2)
    at(131, "w2", "info", "stats", active=2)
    for f in files.values():
        f.close()
    (tmp_path / "emulator.log").write_text("moto says hello\n")  # not a worker's line: skipped
    (tmp_path / "report.json").write_text(json.dumps({
        "seed": 42, "passed": False, "replay": "make chaos SEED=42",
        "violations": {"lost": 0, "overlap": 1},
        "faults": [{"n": 1, "kind": "kill", "started_at": 110.5, "healed_at": 115.0, "victim": "w1",
                    "recovery_s": 10.6, "bound_s": 13.5}],
    }))
    return tmp_path


def test_the_timeline_reads_owners_fences_and_sockets_from_the_workers_lines(tmp_path, monkeypatch):
    t = timeline.read(write_run(tmp_path, monkeypatch))

    assert list(t.lanes) == ["c1", "c2", "c3"] and t.workers == ["w1", "w2"]
    c1 = t.lanes["c1"]
    assert [(p.worker, p.fence, p.start, p.end, p.why) for p in c1.periods] == [
        ("w1", 1, 101, 110, timeline.STILL_HELD),  # w1's last line; the log ends with it still held
        ("w2", 2, 121, 131, timeline.STILL_HELD),
    ]
    assert c1.gaps() == [(110, 121.1)]  # killed at its last line, new socket at 121.1
    c3 = t.lanes["c3"]
    assert [(p.end, p.why) for p in c3.periods] == [(130.3, "stopped")]
    assert [(m.event, m.level) for m in c3.markers] == [("frame_dropped", "error"), ("stop_received", "info")]
    assert t.load["w2"][-1] == (131, 2) and t.skipped == 1


def test_a_new_process_ends_what_the_last_one_left_open(monkeypatch):
    lines = [
        {"ts": 1, "event": "worker_started", "worker_id": "w1"},
        {"ts": 2, "event": "lease_acquired", "worker_id": "w1", "connection_id": "c1", "fence_token": 3},
        {"ts": 4, "event": "stats", "worker_id": "w1", "active": 1},
        {"ts": 9, "event": "worker_started", "worker_id": "w1"},
    ]
    [period] = timeline.build(lines).lanes["c1"].periods
    assert (period.end, period.why) == (4, timeline.PROCESS_GONE)


def test_exported_logs_with_a_timestamp_before_each_line_are_read_gzipped(tmp_path):
    line = json.dumps({"ts": 5.0, "level": "info", "event": "lease_acquired", "worker_id": "task-1",
                       "connection_id": "feed-1", "fence_token": 1, "active": 1})
    (tmp_path / "stream").mkdir()
    with gzip.open(tmp_path / "stream" / "000000.gz", "wt") as f:
        f.write(f"2026-12-06T10:00:05.000Z {line}\n")

    t = timeline.read(tmp_path)
    assert [p.worker for p in t.lanes["feed-1"].periods] == ["task-1"] and t.files == 1


def test_the_report_is_one_well_formed_page_with_a_lane_per_connection_fault_bands_and_verdicts(tmp_path, monkeypatch,
                                                                                            capsys):
    run_dir = write_run(tmp_path, monkeypatch)
    monkeypatch.undo()

    assert main(["report", str(run_dir)]) == 0
    path = run_dir / "report.html"
    assert capsys.readouterr().out.strip() == str(path)
    html = path.read_text()
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")

    page = ET.fromstring(html)
    lanes = [g for g in page.iter(f"{SVG}g") if g.get("class") == "lane"]
    assert [g.get("data-connection") for g in lanes] == ["c1", "c2", "c3"]
    c1_owners = [r.findtext(f"{SVG}title") for r in lanes[0].iter(f"{SVG}rect") if "fence" in (r.findtext(f"{SVG}title") or "")]
    assert [tip.split(":")[0] for tip in c1_owners] == ["w1, fence 1 (hint)", "w2, fence 2 (orphan)"]
    assert any("no socket for 11.10 s" == g.findtext(f"{SVG}title") for g in lanes[0].iter(f"{SVG}line"))
    tips = [r.findtext(f"{SVG}title") or "" for r in page.iter(f"{SVG}rect")]
    assert sum(tip.startswith("#1 kill:") and "victim w1" in tip for tip in tips) == 2  # across lanes and load
    verdicts = {tr[0].text: tr[1].text for tr in page.iter("tr") if tr[0].tag == "td"}
    assert verdicts == {"the run as a whole": "VIOLATED", "lost": "ok", "overlap": "VIOLATED"}
    assert "replay: make chaos SEED=42" in html


def test_the_demos_events_become_bands_from_its_origin():
    notes = run_verdicts.from_report({
        "passed": True, "t_origin": 1000.0,
        "events": [{"kind": "crash", "label": "crash w2", "at_s": 30.0, "bound_s": 13.5, "max_s": 11.2, "pending": []},
                   {"kind": "pause", "label": "pause w3", "at_s": 60.0, "until_s": 75.0, "bound_s": 2.0, "max_s": 3.0}],
    })
    assert [(b.label, b.start, b.end) for b in notes.bands] == [("crash w2", 1030.0, 1031.0), ("pause w3", 1060.0, 1075.0)]
    assert [(v.name, v.ok) for v in notes.verdicts] == [("the run as a whole", True), ("crash w2", True), ("pause w3", False)]


def test_a_directory_without_worker_lines_is_a_sentence_not_a_traceback(tmp_path, capsys):
    (tmp_path / "api.log").write_text("GET / 200\n")
    assert main(["report", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("wsfleet: no worker log line in ") and "Traceback" not in err


def test_the_plan_chart_marks_the_first_limit_where_its_use_crosses_one(tmp_path, capsys):
    out = tmp_path / "plan.svg"
    assert main(["plan", "--env", "prod", "--connections", "200000", "--rate", "0.5", "--chart", str(out)]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"chart: {out}")
    root = ET.parse(out).getroot()
    words = " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
    assert "first limit to bind:" in words and "--connections 200,000" in words
    assert plan_chart.crossing([(1000, 0.1), (10_000, 10.0)]) == pytest.approx(3162.3, rel=1e-3)
    assert plan_chart.crossing([(1000, 2.0), (10_000, 3.0)]) == 1000 and plan_chart.crossing([(1000, 0.5)]) is None


def test_watch_on_a_terminal_redraws_in_place():
    out = io.StringIO()

    def sleep(_):
        raise KeyboardInterrupt

    assert watch.run(lambda: "fleet A", interval=1, out=out, tty=True, sleep=sleep) == 0
    assert out.getvalue().startswith(watch.CLEAR_SCREEN + watch.HOME) and watch.CLEAR_BELOW in out.getvalue()


def test_alarms_are_named_by_the_stacks_prefix():
    assert watch.alarm_prefix("wsfleet-prod-stateful") == "wsfleet-prod-"
    assert watch.alarm_prefix("wsfleet-dev-service") == "wsfleet-dev-"


def test_watch_for_a_script_prints_one_line_a_snapshot_and_a_failed_read_as_json():
    from botocore.exceptions import EndpointConnectionError

    out, naps = io.StringIO(), []

    def snapshot():
        if naps:
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
        return '{"workers": []}'

    def sleep(_):
        naps.append(1)
        if len(naps) == 2:
            raise KeyboardInterrupt

    assert watch.run(snapshot, interval=1, out=out, tty=True, lines=True, sleep=sleep) == 0
    first, second = out.getvalue().splitlines()
    assert json.loads(first) == {"workers": []} and "127.0.0.1:1" in json.loads(second)["error"]
