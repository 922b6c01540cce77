"""How a chaos run judges its hostile peers and their neighbours (sim/chaos/hostile_check.py),
on evidence built by hand."""

from __future__ import annotations

import json

from sim.chaos.evidence import Row
from sim.chaos.history import Applied
from sim.chaos.hostile_check import (
    HostileEvidence,
    check,
    check_error,
    check_rows,
    connection_id,
    neighbour_gaps,
    quiet_windows,
)
from sim.chaos.schedule import Bounds
from sim.timing import Timing
from sim.upstream.kinds import firehose_data

FIREHOSE, FLOOD, AMPLIFY, SLOW = (connection_id(k) for k in ("firehose", "ping_flood", "amplify", "slow_handshake"))


def row(seq: int, data: str = "", *, skipped: str = "", fence: int = 1, at_ms: int = 0) -> Row:
    return Row(seq=seq, fence=fence, worker="w1", received_at_ms=at_ms or 1_000_000 + 500 * seq, data=data, skipped=skipped)


def firehose_row(seq: int) -> Row:
    return row(seq, json.dumps(firehose_data(FIREHOSE, seq), separators=(",", ":")))


def test_a_firehoses_rows_must_be_its_frames_from_seq_1_without_a_hole_markers_allowed():
    assert check_rows(FIREHOSE, [firehose_row(1), row(2, skipped="reconnect"), firehose_row(3)], {}) == []
    [wrong] = check_rows(FIREHOSE, [firehose_row(1), row(2, '{"v":2}')], {})
    assert wrong.startswith("seq 2: stored")
    [hole] = check_rows(FIREHOSE, [firehose_row(1), firehose_row(3)], {})
    assert "1 seqs missing" in hole and "[2]" in hole


def test_a_ping_flood_or_a_slow_handshake_stores_no_data_and_an_amplifier_its_ordinary_frames():
    assert check_rows(FLOOD, [], {}) == [] and check_rows(SLOW, [row(1, skipped="reconnect")], {}) == []
    assert len(check_rows(FLOOD, [row(1, '{"v":1}')], {})) == 1
    books = {seq: f'{{"v":{seq}}}' for seq in range(1, 22)}
    rows = [row(seq, books[seq]) for seq in range(1, 20)] + [row(20, skipped="over_frame_limit"), row(21, books[21])]
    assert check_rows(AMPLIFY, rows, books) == []
    assert check_rows(AMPLIFY, rows[:19] + [row(20, "[{},{},{}]"), row(21, books[21])], books) == []  # parsed in budget
    assert len(check_rows(AMPLIFY, rows[:18] + [row(19, "[{},{}]")], books)) == 1  # not an amplified seq


def test_a_ping_flood_must_carry_control_flood_within_30_s_of_its_first_socket_and_other_kinds_are_not_judged():
    assert check_error(FLOOD, 100.0, [(104.0, ""), (112.0, "control_flood: the upstream sent ...")], 0) is None
    assert "41.0s after" in check_error(FLOOD, 100.0, [(141.0, "control_flood: ...")], 0)
    assert "never seen" in check_error(FLOOD, 100.0, [(110.0, "refused: 403")], 0)
    assert check_error(FLOOD, None, [], 0) == "no socket was ever opened"
    assert check_error(SLOW, 100.0, [], 0) is None and check_error(FIREHOSE, None, [], 0) is None


def test_quiet_windows_are_the_chaos_phase_less_each_fault_and_its_recovery_bound():
    bounds = Bounds(Timing())
    a = Applied(1, "drop", 100.0, affected={"c1": 101.0})
    quiet = quiet_windows([a], (50.0, 400.0), bounds, slack_s=1.0)
    end = 101.0 + bounds.for_kind("drop", "") + 1.0
    assert quiet == [(50.0, 100.0), (end, 400.0)]
    assert quiet_windows([], (50.0, 60.0), bounds, 0) == [(50.0, 60.0)]


def test_a_neighbours_gap_counts_only_inside_a_quiet_window_and_within_one_ownership():
    t = 1_000_000
    rows = [row(1, "1", at_ms=t), row(2, "2", at_ms=t + 500), row(3, "3", at_ms=t + 2000),  # 1.5 s: over
            row(4, "4", fence=2, at_ms=t + 5000),  # another owner: a move's gap is not the neighbour's
            row(5, "5", fence=2, at_ms=t + 5400)]
    judged, longest, over = neighbour_gaps(rows, [(t / 1000, t / 1000 + 10)], 1.0)
    assert (judged, longest, len(over)) == (3, 1500, 1) and over[0].startswith("seqs 2-3 received 1500 ms apart")
    assert neighbour_gaps(rows, [(t / 1000 + 2.5, t / 1000 + 10)], 1.0) == (1, 400, [])  # the gap was in a fault


def test_the_hostile_verdict_names_each_violation_and_counts_what_it_judged():
    ev = HostileEvidence(
        rows={FLOOD: [], FIREHOSE: [firehose_row(1), firehose_row(2)]},
        frames={},
        first_socket_at={FLOOD: 100.0, FIREHOSE: 100.0},
        errors={FLOOD: [(140.0, "control_flood: ...")]},
        chaos=(0.0, 2000.0),
    )
    healthy = {"c001": [row(1, "1", at_ms=1_000_000), row(2, "2", at_ms=1_003_000)]}
    violations, totals, notes = check(ev, healthy, [], Bounds(Timing()), 0.0)
    assert sorted(kind for kind, _, _ in violations) == ["hostile_error", "neighbour_gap"]
    assert totals["hostile_firehose_rows"] == 2 and totals["neighbour_longest_gap_ms"] == 3000
    assert any(n.startswith(f"{FLOOD}: last_error 'control_flood' seen 40.0s") for n in notes)
