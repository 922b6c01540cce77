"""The ``slow`` marker keeps ``make check`` fast on its own: a test that starts a process
or runs a worker's loop without it fails, naming the marker (tests/markers.py)."""

from __future__ import annotations

import pytest

INNER = """
import asyncio
import subprocess

import pytest

from wsfleet.worker.lifecycle import Worker


def test_unmarked_starts_a_process():
    subprocess.run(["true"])


def test_unmarked_swallows_the_refusal():
    try:
        subprocess.run(["true"])
    except RuntimeError:
        pass


def test_unmarked_runs_a_worker():
    asyncio.run(Worker.run(None))


def test_unmarked_and_quick():
    assert True


@pytest.mark.slow
def test_marked_starts_a_process():
    subprocess.run(["true"], check=True)
"""


def run_inner(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_inner=INNER)
    return pytester.runpytest_inprocess("-p", "tests.markers", "-W", "ignore::pytest.PytestUnknownMarkWarning", *args)


def test_an_unmarked_test_that_starts_a_process_or_runs_a_worker_fails_naming_the_marker(pytester):
    result = run_inner(pytester)

    result.assert_outcomes(passed=3, failed=2, errors=1)  # the swallowed refusal fails at teardown
    failed = {r.nodeid.split("::")[-1] for r in result.reprec.getreports("pytest_runtest_logreport") if r.failed}
    assert failed == {"test_unmarked_starts_a_process", "test_unmarked_swallows_the_refusal", "test_unmarked_runs_a_worker"}
    result.stdout.fnmatch_lines(["*test_unmarked_starts_a_process starts a process (subprocess.Popen *true*) but is not marked slow: add @pytest.mark.slow*"])
    result.stdout.fnmatch_lines(["*test_unmarked_runs_a_worker runs a worker's loop (Worker.run) but is not marked slow: add @pytest.mark.slow*"])


def test_a_refusal_the_test_swallowed_still_fails_it_at_teardown(pytester):
    result = run_inner(pytester, "-k", "swallows")

    result.assert_outcomes(passed=1, errors=1)  # the body passed; its teardown reports the refusal
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_unmarked_swallows_the_refusal*", "*not marked slow*"])

