"""How ``make test`` hands tests out to its pytest-xdist workers.

Slow tests (tests/markers.py) go first, so that the longest ones start early and the
quick ones fill in around them, instead of one long test running alone at the end.

The stack tests share one synth of every environment (a session fixture, seconds of
jsii), so they go to one worker together; every other test goes wherever a worker is
free. (xdist's own ``--dist loadgroup`` would do it, but the group it appends to a
test's id no longer reaches pytest 9's node ids.)
"""

from __future__ import annotations

import pytest

from tests.markers import SLOW

STACK_TESTS = "tests/stacks/"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker(SLOW) is None)  # stable: slow first


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "load":
        return None  # another distribution asked for by name: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class StacksTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return STACK_TESTS if nodeid.startswith(STACK_TESTS) else nodeid

    return StacksTogether(config, log)
