"""The hint intake's part in the free scan's pace: a poll that cannot reach the queue
means a START's hint may be lost, so the scan is told there is work."""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace

import pytest
from botocore.exceptions import EndpointConnectionError

from wsfleet.logs import JsonLogger
from wsfleet.worker.holdings import Holdings
from wsfleet.worker.intake import Intake
from wsfleet.worker.summary import FleetSummary


class _Aws:
    sqs = SimpleNamespace(receive_message=None)

    def __init__(self, answer):
        self._answer = answer

    async def poll(self, fn, /, **kwargs):
        if isinstance(self._answer, BaseException):
            raise self._answer
        return self._answer


def _intake(answer) -> tuple[Intake, list[str]]:
    noted: list[str] = []
    intake = Intake(
        aws=_Aws(answer), queue_url="q", log=JsonLogger(io.StringIO()),
        holdings=Holdings(max_connections=5, summary=FleetSummary()),
        acquisition=SimpleNamespace(accepting=lambda: True),
        keeper=SimpleNamespace(session_id=""), takeover=SimpleNamespace(note_work=lambda: noted.append("work")),
    )
    return intake, noted


def test_a_poll_that_cannot_reach_the_queue_tells_the_free_scan_there_is_work_and_still_fails():
    intake, noted = _intake(EndpointConnectionError(endpoint_url="http://sqs"))
    with pytest.raises(EndpointConnectionError):  # the poll loop's supervision counts and backs off
        asyncio.run(intake.poll_once(wait_seconds=0))
    assert noted == ["work"]


def test_an_empty_poll_leaves_the_free_scan_to_its_backed_off_pace():
    intake, noted = _intake({"Messages": []})
    assert asyncio.run(intake.poll_once(wait_seconds=0)) == 0
    assert noted == []


def test_a_cancelled_poll_is_not_an_outage():
    intake, noted = _intake(asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(intake.poll_once(wait_seconds=0))
    assert noted == []
