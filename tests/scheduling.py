"""How ``make test`` hands tests out to its pytest-xdist workers.

The longest tests go first, longest first (``EXPECTED_S``), then the other slow tests
(tests/markers.py), then the quick ones, which fill in around them: a long test handed
out late runs alone at the end and sets the wall time. (The chaos run alone is a
third of the target for the whole run; started last, it would add all of that.)

The stack tests share one synth of every environment (a session fixture, seconds of
jsii), so they go to one worker together; every other test goes wherever a worker is
free. (xdist's own ``--dist loadgroup`` would do it, but the group it appends to a
test's id no longer reaches pytest 9's node ids.)
"""

from __future__ import annotations

import pytest

from tests.markers import SLOW

STACK_TESTS = "tests/stacks/"

# Seconds each of the longest tests took in `pytest -n 4` on the 2-core machine with
# other work beside it (its slowest: the order is what matters, not the figures). A
# key is a node id, or a test function's id for every parameter of it. A test
# missing here is handed out after these; test_scheduling checks each key still
# names a test, so that a renamed one does not silently lose its place.
EXPECTED_S = {
    "tests/test_fleet_upstreams.py::test_every_upstream_kind_survives_kill_9_of_its_owners_nothing_lost_doubled_or_invented": 30,
    "tests/test_chaos.py::test_a_short_seeded_chaos_run_finds_no_violation": 115,
    "tests/test_bench.py::test_every_benchmark_runs_at_tiny_size_and_writes_its_results[pauses]": 72,
    "tests/test_balancer.py::test_a_joining_worker_gets_its_fair_share_and_only_the_excess_moves": 68,
    "tests/test_fleet.py::test_workers_whose_wall_clocks_disagree_by_less_than_the_skew_margin_never_overlap_lose_or_double": 68,
    "tests/test_bench.py::test_every_benchmark_runs_at_tiny_size_and_writes_its_results[faults]": 49,
    "tests/test_fleet.py::test_sigterm_during_a_start_burst_leaves_every_connection_reachable_and_soon_owned": 48,
    "tests/test_bench.py::test_every_benchmark_runs_at_tiny_size_and_writes_its_results[rebalance]": 48,
    "tests/test_demo.py::test_the_demo_plays_the_full_scenario_and_passes_its_own_audit": 47,
    "tests/test_bench.py::test_every_benchmark_runs_at_tiny_size_and_writes_its_results[failover]": 43,
    "tests/test_balancer.py::test_what_workers_shed_goes_to_the_one_under_its_share_not_to_peers_at_theirs": 42,
    "tests/test_fleet.py::test_messages_stay_gap_free_through_a_crash_a_handoff_and_a_second_crash": 37,
    "tests/test_fleet.py::test_a_worker_paused_past_its_lease_writes_nothing_more_and_comes_back_with_a_new_session": 36,
    "tests/test_fleet.py::test_a_terminated_worker_hands_its_connections_over_well_before_its_lease_would_expire": 36,
    "tests/test_bench.py::test_every_benchmark_runs_at_tiny_size_and_writes_its_results": 30,  # the other benchmarks
    "tests/test_fleet.py::test_a_crashed_workers_connections_are_taken_over_once_its_session_expires_within_lease_plus_skew_and_slack": 32,
    "tests/test_fleet.py::test_sigterm_of_the_worker_draining_a_dead_workers_session_leaves_nothing_unreachable": 24,
    "tests/test_scheduling.py::test_the_stack_tests_go_to_one_worker_so_their_session_fixture_runs_once": 22,
    "tests/test_demo.py::test_stopping_the_demo_leaves_no_process_behind": 18,
    "tests/test_cli.py::test_pip_install_of_runtime_gives_the_package_and_the_wsfleet_command": 16,
    "tests/test_balancer.py::test_with_rebalance_off_a_joining_worker_gets_only_new_connections": 16,
}


def expected_s(nodeid: str) -> float:
    """How long a test is expected to take (0: not one of the longest)."""
    return EXPECTED_S.get(nodeid, EXPECTED_S.get(nodeid.split("[", 1)[0], 0))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Stable: within a rank, collection order.
    items.sort(key=lambda item: (-expected_s(item.nodeid), item.get_closest_marker(SLOW) is None))


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "load":
        return None  # another distribution asked for by name: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class StacksTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return STACK_TESTS if nodeid.startswith(STACK_TESTS) else nodeid

    return StacksTogether(config, log)
