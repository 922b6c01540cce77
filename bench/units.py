"""DynamoDB's capacity units computed from the sizes of real items, by DynamoDB's rules
(moto does not report consumed capacity faithfully): an attribute's and an item's size,
write and read units, the index writes a write makes (see :mod:`.cost` for each rule),
and the connection items the store's own releases leave, to size them from."""

from __future__ import annotations

import math
import uuid
from typing import Any, Mapping

from wsfleet import schema
from wsfleet.store import ConnectionsStore, Released, SessionsStore


def attribute_size(name: str, value: Any) -> int:
    """DynamoDB's size of one attribute: name bytes plus value bytes (numbers: 1 byte
    per two significant digits, plus 1; sets: the sum of their members)."""
    n = len(name.encode())
    if isinstance(value, bool) or value is None:
        return n + 1
    if isinstance(value, (int, float)):
        digits = str(abs(int(value))).strip("0") or "0"
        return n + math.ceil(len(digits) / 2) + 1
    if isinstance(value, bytes):
        return n + len(value)
    if isinstance(value, (set, frozenset)):
        return n + sum(attribute_size("", v) for v in value)
    return n + len(str(value).encode())


def item_size(item: Mapping[str, Any]) -> int:
    return sum(attribute_size(k, v) for k, v in item.items())


def write_units(size: int) -> int:
    return max(1, math.ceil(size / 1024))


def read_units_eventual(size: int) -> float:
    return 0.5 * max(1, math.ceil(size / 4096))


def index_writes(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, index: Mapping[str, Any]) -> int:
    """Index writes DynamoDB makes when an item goes from ``old`` to ``new`` (None: absent),
    for one GlobalSecondaryIndexes entry of a CreateTable spec."""
    keys = [k["AttributeName"] for k in index["KeySchema"]]
    was = old is not None and all(k in old for k in keys)
    now = new is not None and all(k in new for k in keys)
    if not (was or now):
        return 0
    if was != now:
        return 1  # put into or deleted from a sparse index
    if any(old[k] != new[k] for k in keys):
        return 2  # the key moved: delete and put
    projection = index["Projection"]
    if projection["ProjectionType"] == "ALL":
        changed = dict(old) != dict(new)
    else:
        changed = any(old.get(a) != new.get(a) for a in projection.get("NonKeyAttributes", ()))
    return 1 if changed else 0


def index_spec(spec: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return next(i for i in spec["GlobalSecondaryIndexes"] if i["IndexName"] == name)


def release_items(ddb: Any, ws_url: str, *, shards: int, last_seq: int) -> dict[str, dict]:
    """A connection item at each step of the ways a worker gives one up, as the store's
    own writes leave it, read back: ``owned`` (acquired), ``handed`` (a graceful handoff,
    SIGTERM or a shed: :meth:`ConnectionsStore.release` with ``handoff``), ``given_up``
    (nobody took it within the handoff's wait: :meth:`ConnectionsStore.free_released`),
    ``stop_owned`` (the router's STOP of an owned one) and ``stopped`` (its owner's release
    for that STOP). In a connections and a sessions table of their own, made here: no
    worker reads them. Raises RuntimeError if a write does not land as the code says."""
    suffix = uuid.uuid4().hex[:8]
    table, sessions_table = f"cost-releases-{suffix}", f"cost-releases-sessions-{suffix}"
    ddb.create_table(**schema.connections_table_spec(table))
    ddb.create_table(**schema.sessions_table_spec(sessions_table))
    sessions = SessionsStore(ddb, sessions_table)
    store = ConnectionsStore(ddb, table, state_shards=shards, sessions_table_name=sessions_table)
    session = "cost-releases#1"
    sessions.open(session, worker_id="cost", lease_ms=600_000, max_connections=2)
    items: dict[str, dict] = {}

    def step(name: str, cid: str, landed: Any) -> None:
        if not landed:
            raise RuntimeError(f"release_items: {name} did not land ({landed!r})")
        items[name] = store.get(cid) or {}

    for cid in ("handed", "stopped"):
        store.start(cid, ws_url)
        step("owned", cid, store.acquire(cid, session_id=session, worker_id="cost"))
    fence = int(items["owned"][schema.FENCE_TOKEN])
    step("handed", "handed", store.release("handed", session_id=session, fence_token=fence, last_seq=last_seq, handoff=True)
         is Released.HANDED)
    step("given_up", "handed", store.free_released("handed", session_id=session, fence_token=fence) is Released.FREE)
    step("stop_owned", "stopped", store.stop("stopped", sessions=sessions).told)
    step("stopped", "stopped", store.release("stopped", session_id=session, fence_token=fence, last_seq=last_seq,
                                             stopped=True) is Released.STOPPED)
    return items
