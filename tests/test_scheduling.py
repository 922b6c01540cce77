"""How ``make test`` hands tests out to its xdist workers (tests/scheduling.py): the
longest tests first, then the other slow ones, and the stack tests together, so that one
worker synthesizes once."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from tests import scheduling

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


def test_the_longest_tests_are_handed_out_first_longest_first_then_the_other_slow_ones(pytester, monkeypatch):
    pytester.makepyfile(
        test_order="""
        import pytest

        def test_quick():
            pass

        @pytest.mark.slow
        def test_slow():
            pass

        @pytest.mark.slow
        def test_long():
            pass

        @pytest.mark.slow
        @pytest.mark.parametrize("n", [1, 2, 3])
        def test_each(n):
            pass
        """
    )
    monkeypatch.setattr(
        scheduling, "EXPECTED_S", {"test_order.py::test_long": 50, "test_order.py::test_each[2]": 90, "test_order.py::test_each": 20}
    )
    result = pytester.runpytest_inprocess("-p", "tests.scheduling", "--collect-only", "-q", "-W", "ignore::pytest.PytestUnknownMarkWarning")

    assert result.stdout.lines[:6] == [
        "test_order.py::test_each[2]",  # its own figure before its function's
        "test_order.py::test_long",
        "test_order.py::test_each[1]",
        "test_order.py::test_each[3]",
        "test_order.py::test_slow",
        "test_order.py::test_quick",
    ]


def test_every_expected_duration_names_a_test_of_this_repository():
    for key in scheduling.EXPECTED_S:
        path, _, name = key.partition("::")
        function, _, param = name.partition("[")
        source = (ROOT / path).read_text()
        defined = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
        assert function in defined, f"{key}: no test {function} in {path}"
        param = param.rstrip("]")
        assert not param or f'"{param}"' in source or f"'{param}'" in source, f"{key}: no parameter {param} in {path}"


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
