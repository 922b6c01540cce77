"""The router and the crash-loop breaker, with hand-built API Gateway events: GET shows a
quarantine as ``{"reason", "at_ms"}`` (and no key without one); a START with the same
ws_url clears it (202) and hints the connection, as ``wsfleet retry`` relies on."""

from __future__ import annotations

import pytest

from wsfleet import schema
from wsfleet.crash_loop import Suspect

from tests.test_router import Api


@pytest.fixture
def api(aws_env, ddb, sqs) -> Api:
    return Api(aws_env, ddb, sqs)


def quarantine(api: Api, connection_id: str) -> None:
    api.hold_lease(connection_id, last_seq=3)
    struck = api.store.strike(connection_id, Suspect(connection_id, 1, "w"), dead_session="worker-a#1", quarantine_after=1)
    assert struck is not None and struck.quarantined is not None


def test_get_shows_a_quarantine_with_its_reason_and_time_and_no_key_without_one(api):
    api.start("feed-1")
    assert schema.QUARANTINED not in api.get("feed-1")[1]
    quarantine(api, "feed-1")
    status, body = api.get("feed-1")
    assert status == 200
    assert set(body[schema.QUARANTINED]) == {"reason", "at_ms"} and isinstance(body[schema.QUARANTINED]["at_ms"], int)
    assert body[schema.QUARANTINED]["reason"].startswith("crash_loop:")
    assert (body[schema.LEASE_OWNER], body[schema.LEASE_EXPIRES_AT_MS]) == ("", 0)


def test_a_start_of_a_quarantined_connection_clears_it_and_hints_it(api):
    api.start("feed-1")
    quarantine(api, "feed-1")
    api.hints()  # the first START's, received (out of sight for now)
    status, body = api.start("feed-1")
    assert (status, body["outcome"]) == (202, "restarted")
    assert schema.QUARANTINED not in api.get("feed-1")[1]
    assert api.hints() == [{"connection_id": "feed-1"}]
    assert api.start("feed-1")[0] == 200  # again: nothing changes
