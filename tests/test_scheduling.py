"""How ``make test`` hands tests out to its xdist workers (tests/scheduling.py): slow
tests first, and the stack tests together, so that one worker synthesizes once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_slow_tests_are_handed_out_first(pytester):
    pytester.makepyfile(
        test_order="""
        import pytest

        def test_quick():
            pass

        @pytest.mark.slow
        def test_slow():
            pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "tests.scheduling", "--collect-only", "-q", "-W", "ignore::pytest.PytestUnknownMarkWarning")

    assert result.stdout.lines[:2] == ["test_order.py::test_slow", "test_order.py::test_quick"]


@pytest.mark.slow
def test_the_stack_tests_go_to_one_worker_so_their_session_fixture_runs_once(pytester, monkeypatch):
    setups = pytester.path / "setups"
    setups.mkdir()
    pytester.makeconftest(
        f"""
        import os
        import pytest

        @pytest.fixture(scope="session")
        def synthesized():
            (__import__("pathlib").Path({str(setups)!r}) / os.environ["PYTEST_XDIST_WORKER"]).touch()
        """
    )
    tests = {f"test_stack_{i}": "def test_a(synthesized):\n    pass\n\ndef test_b(synthesized):\n    pass\n" for i in range(4)}
    pytester.mkdir("tests")
    pytester.mkdir("tests/stacks")
    for name, body in tests.items():
        (pytester.path / "tests" / "stacks" / f"{name}.py").write_text(body)
    pytester.makepyfile(**{f"tests/test_other_{i}": "def test_c():\n    pass\n" for i in range(8)})
    # The child imports tests.scheduling from this repository, by absolute path.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "runtime"), str(ROOT)]))

    result = pytester.runpytest_subprocess("-p", "tests.scheduling", "-n", "2", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=16)
    assert len(list(setups.iterdir())) == 1, sorted(p.name for p in setups.iterdir())
