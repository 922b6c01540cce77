"""The table commands' reads. Every one goes through the store where it has one (who
owns what, through the ``by_owner`` index); the few it lacks are here: a Scan of the
sessions table, a Scan of the connections table (counts, or every item), a BatchGetItem
of connections. They only read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from .. import schema
from ..leases import released_at_fence
from ..store import ConnectionsStore, marshal, unmarshal
from .locate import Tables

BATCH_GET_MAX = 100  # BatchGetItem's limit


@dataclass(frozen=True)
class Session:
    """One worker session as read, and what it means at ``now``."""

    session_id: str
    worker_id: str
    state: str
    expires_at_ms: int
    heartbeat_at_ms: int
    started_at_ms: int
    active: int
    max_connections: int
    ended_by: str
    in_ring: bool  # LIVE, or ENDED with connections possibly still attached
    # An operator asked it to leave (wsfleet drain): who and when (at 0: never asked).
    drain_by: str = ""
    drain_at_ms: int = 0

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> "Session":
        return cls(
            session_id=item[schema.SESSION_ID],
            worker_id=item.get(schema.SESSION_WORKER_ID, ""),
            state=item.get(schema.SESSION_STATE, ""),
            expires_at_ms=int(item.get(schema.EXPIRES_AT_MS, 0)),
            heartbeat_at_ms=int(item.get(schema.HEARTBEAT_AT_MS, 0)),
            started_at_ms=int(item.get(schema.STARTED_AT_MS, 0)),
            active=int(item.get(schema.ACTIVE, 0)),
            max_connections=int(item.get(schema.MAX_CONNECTIONS, 0)),
            ended_by=item.get(schema.ENDED_BY, ""),
            in_ring=schema.RING in item,
            drain_by=str((item.get(schema.DRAIN_REQUESTED) or {}).get(schema.DRAIN_BY, "")),
            drain_at_ms=int((item.get(schema.DRAIN_REQUESTED) or {}).get(schema.DRAIN_AT_MS, 0)),
        )

    def live_at(self, now: int) -> bool:
        """It owns what is attached to it (CONTRACT 5: LIVE and not expired)."""
        return self.state == schema.LIVE and self.expires_at_ms > now

    def holds_orphans_at(self, now: int) -> bool:
        """Not live, yet connections may still be attached: expired and not yet ended
        by a watcher, or ended and not yet drained."""
        return not self.live_at(now) and (self.state == schema.LIVE or self.in_ring)

    def describe(self, now: int) -> str:
        if self.live_at(now):
            return "live"
        return "LIVE, expired" if self.state == schema.LIVE else self.state


@dataclass(frozen=True)
class ScanSummary:
    """What one pass over the connections table counts."""

    by_state: dict[str, int]
    oldest_owned: dict | None  # the owned STARTED item updated longest ago (not one handed off)
    free_shards: frozenset[int]  # FREE#<shard> partitions seen
    refused: tuple[dict, ...] = ()  # STARTED items with a last_error (key, last_error, last_error_at_ms)
    # STARTED items a live session handed off and nobody has taken yet (released at their
    # fence): attached, but no socket is open for them.
    handed_off: tuple[dict, ...] = ()
    # STARTED items the crash-loop breaker quarantined (key, quarantined): none runs.
    quarantined: tuple[dict, ...] = ()


class FleetReader:
    """The CLI's reads. The sessions table is small (one item per worker run, ended
    ones kept a week), so it is scanned whole; connections are read through the
    ``by_owner`` index, except for counts by state, which need a Scan."""

    def __init__(self, ddb: Any, tables: Tables) -> None:
        self._ddb = ddb
        self.tables = tables
        # The store's reads of the by_owner index: owned_by(session), free(shard).
        self.connections = ConnectionsStore(ddb, tables.connections, state_shards=tables.state_shards)

    def _pages(self, op: str, **kwargs: Any) -> Iterator[dict]:
        while True:
            resp = getattr(self._ddb, op)(**kwargs)
            yield resp
            if "LastEvaluatedKey" not in resp:
                return
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def sessions(self) -> dict[str, Session]:
        return {
            s.session_id: s
            for page in self._pages("scan", TableName=self.tables.sessions)
            for s in (Session.from_item(unmarshal(raw)) for raw in page.get("Items", []))
        }

    def summary(self, live: set[str]) -> ScanSummary:
        """One paginated Scan of the connections table (it reads every item)."""
        by_state: dict[str, int] = {}
        oldest: dict | None = None
        free_shards: set[int] = set()
        refused: list[dict] = []
        handed_off: list[dict] = []
        quarantined: list[dict] = []
        names = {
            "#s": schema.DESIRED_STATE,
            "#u": schema.UPDATED_AT_MS,
            "#l": schema.LEASE_SESSION,
            "#k": schema.OWNER_KEY,
            "#p": schema.PK,
            "#e": schema.LAST_ERROR,
            "#t": schema.LAST_ERROR_AT_MS,
            "#f": schema.FENCE_TOKEN,
            "#rf": schema.RELEASED_FENCE,
            "#q": schema.QUARANTINED,
        }
        for page in self._pages(
            "scan",
            TableName=self.tables.connections,
            ProjectionExpression=", ".join(names),
            ExpressionAttributeNames=names,
        ):
            for item in map(unmarshal, page.get("Items", [])):
                state = item.get(schema.DESIRED_STATE, "")
                by_state[state] = by_state.get(state, 0) + 1
                key = item.get(schema.OWNER_KEY, "")
                if key.startswith(schema.OWNER_KEY_FREE_PREFIX):
                    free_shards.add(int(key[len(schema.OWNER_KEY_FREE_PREFIX) :]))
                attached = state == schema.STARTED and item.get(schema.LEASE_SESSION) in live
                if attached and released_at_fence(item):
                    handed_off.append(item)
                elif attached and (
                    oldest is None or item.get(schema.UPDATED_AT_MS, 0) < oldest.get(schema.UPDATED_AT_MS, 0)
                ):
                    oldest = item
                if state == schema.STARTED and item.get(schema.LAST_ERROR):
                    refused.append(item)
                if state == schema.STARTED and isinstance(item.get(schema.QUARANTINED), dict):
                    quarantined.append(item)
        return ScanSummary(by_state, oldest, frozenset(free_shards), tuple(refused), tuple(handed_off), tuple(quarantined))

    def items(self, connection_ids: Sequence[str]) -> dict[str, dict]:
        """The connection items, BatchGetItem by a hundred (missing ones left out)."""
        found: dict[str, dict] = {}
        ids = list(dict.fromkeys(connection_ids))
        for start in range(0, len(ids), BATCH_GET_MAX):
            keys = [marshal({schema.PK: schema.connection_pk(c)}) for c in ids[start : start + BATCH_GET_MAX]]
            while keys:
                resp = self._ddb.batch_get_item(RequestItems={self.tables.connections: {"Keys": keys}})
                for item in map(unmarshal, resp.get("Responses", {}).get(self.tables.connections, [])):
                    found[schema.connection_id_from_pk(item[schema.PK])] = item
                keys = resp.get("UnprocessedKeys", {}).get(self.tables.connections, {}).get("Keys", [])
        return found

    def all_connections(self, state: str | None) -> list[dict]:
        """A paginated Scan of the connections table, ``state`` filtered server-side."""
        kwargs: dict[str, Any] = {"TableName": self.tables.connections}
        if state:
            kwargs.update(
                FilterExpression="#s = :s",
                ExpressionAttributeNames={"#s": schema.DESIRED_STATE},
                ExpressionAttributeValues=marshal({":s": state}),
            )
        return [unmarshal(raw) for page in self._pages("scan", **kwargs) for raw in page.get("Items", [])]

