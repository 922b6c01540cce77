"""The emulator's books, independent of the system under test: the write journal
(``/_wsfleet/journal``) and the request ledger (``/_wsfleet/requests``); see
:mod:`sim.emulator`."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import parse_qs

from wsfleet import schema
from .emulator_wsgi import WSGIApp
from .emulator_wsgi import json_response as _json
from .emulator_wsgi import operation as _operation
from .emulator_wsgi import read_body as _read_body

REQUESTS_PATH = "/_wsfleet/requests"
JOURNAL_PATH = "/_wsfleet/journal"


class Journal:
    """The writes that decide ownership and data, in the order DynamoDB applied them
    (recorded by :class:`SerializedDynamoDB` inside its lock). Off until switched on.
    Entries: ``put`` (a message item), ``update`` (an acquisition), ``checkpoint`` and
    ``release`` (``last_seq`` written), ``ended`` (a session ended)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recording = False
        self._entries: list[dict[str, Any]] = []

    def wants(self, op: str) -> bool:
        return self._recording and op in ("BatchWriteItem", "UpdateItem", "TransactWriteItems")

    def switch(self, record: bool) -> None:
        with self._lock:
            self._recording = record
            if record:
                self._entries.clear()

    def record(self, op: str, request: bytes, response: bytes) -> None:
        try:
            body = json.loads(request or b"{}")
            answer = json.loads(response or b"{}")
        except ValueError:
            return
        t_ms = int(time.time() * 1000)
        if op == "BatchWriteItem":
            unprocessed = {json.dumps(r, sort_keys=True) for reqs in answer.get("UnprocessedItems", {}).values() for r in reqs}
            for table, requests in body.get("RequestItems", {}).items():
                for req in requests:
                    item = req.get("PutRequest", {}).get("Item")
                    if item and json.dumps(req, sort_keys=True) not in unprocessed:
                        self._append({"op": "put", "table": table, "pk": _attr(item, schema.MSG_PK),
                                      "sk": _attr(item, schema.MSG_SK), "fence": _attr(item, schema.MSG_FENCE_TOKEN),
                                      "worker": _attr(item, schema.MSG_WORKER_ID), "t_ms": t_ms,
                                      "received_ms": _attr(item, schema.RECEIVED_AT_MS)})
        elif op == "TransactWriteItems":
            # A transaction answers no attributes: an acquisition is read from the
            # Update itself, which sets the new fence (store.ConnectionsStore.acquire_many).
            for entry in body.get("TransactItems", []):
                update = entry.get("Update") or {}
                values = _assignments(update)
                if schema.FENCE_TOKEN in values:
                    self._append({"op": "update", "table": update.get("TableName", ""),
                                  "pk": _attr(update.get("Key", {}), schema.PK), "fence": values[schema.FENCE_TOKEN],
                                  "session": values.get(schema.LEASE_SESSION), "worker": values.get(schema.LEASE_OWNER),
                                  "t_ms": t_ms})
                elif schema.LAST_SEQ in values:
                    self._append({"op": "checkpoint", "table": update.get("TableName", ""),
                                  "pk": _attr(update.get("Key", {}), schema.PK), "last_seq": values[schema.LAST_SEQ],
                                  "fence": _assignments(update, clause="ConditionExpression").get(schema.FENCE_TOKEN),
                                  "t_ms": t_ms})
        else:
            # A release stores the last checkpoint and answers nothing: read it from the request.
            values = _assignments(body)
            if schema.LAST_SEQ in values:
                self._append({"op": "release", "table": body.get("TableName", ""), "pk": _attr(body.get("Key", {}), schema.PK),
                              "last_seq": values[schema.LAST_SEQ], "fence": values.get(schema.CHECKPOINT_IS_END), "t_ms": t_ms})
            item = answer.get("Attributes", {})
            if schema.FENCE_TOKEN in item:
                self._append({"op": "update", "table": body.get("TableName", ""), "pk": _attr(item, schema.PK),
                              "fence": _attr(item, schema.FENCE_TOKEN), "session": _attr(item, schema.LEASE_SESSION),
                              "worker": _attr(item, schema.LEASE_OWNER), "t_ms": t_ms})
            elif _attr(item, schema.SESSION_STATE) == schema.ENDED and _attr(item, schema.SESSION_ID):
                self._append({"op": "ended", "table": body.get("TableName", ""), "session": _attr(item, schema.SESSION_ID),
                              "by": _attr(item, schema.ENDED_BY), "worker": _attr(item, schema.SESSION_WORKER_ID), "t_ms": t_ms})

    def _append(self, entry: dict[str, Any]) -> None:
        with self._lock:
            entry["n"] = len(self._entries)
            self._entries.append(entry)

    def since(self, n: int, limit: int = 50_000) -> dict[str, Any]:
        with self._lock:
            chunk = self._entries[n : n + limit]
            return {"recording": self._recording, "entries": chunk, "next": n + len(chunk), "total": len(self._entries)}

    def __call__(self, app: WSGIApp) -> WSGIApp:
        def control(environ: dict, start_response: Callable) -> Iterable[bytes]:
            if environ.get("PATH_INFO") != JOURNAL_PATH:
                return app(environ, start_response)
            if environ.get("REQUEST_METHOD") == "POST":
                try:
                    self.switch(bool(json.loads(_read_body(environ) or b"{}").get("record")))
                except (ValueError, AttributeError) as exc:
                    return _json("400 Bad Request", {"error": "bad_request", "message": str(exc)}, start_response)
            query = parse_qs(environ.get("QUERY_STRING", ""))
            try:
                since = int(query.get("since", ["0"])[0])
            except ValueError:
                since = 0
            return _json("200 OK", self.since(max(0, since)), start_response)

        return control


def _assignments(update: Mapping[str, Any], clause: str = "UpdateExpression") -> dict[str, Any]:
    """The ``SET name = :value`` parts of an Update's expression, as plain values by
    attribute name (other clauses and computed values are left out); with ``clause``
    ConditionExpression, its ``name = :value`` comparisons."""
    names = update.get("ExpressionAttributeNames") or {}
    values = update.get("ExpressionAttributeValues") or {}
    set_clause = re.split(r"\b(?:REMOVE|ADD|DELETE)\b", update.get(clause) or "")[0]
    found = {}
    for placeholder, value in re.findall(r"(#\w+)\s*=\s*(:\w+)", set_clause):
        if placeholder in names and value in values:
            found[names[placeholder]] = _attr(values, value)
    return found


def _attr(item: Mapping[str, Any], name: str) -> Any:
    """A plain value from a DynamoDB JSON attribute (numbers as int)."""
    value = item.get(name)
    if not isinstance(value, Mapping) or not value:
        return None
    kind, raw = next(iter(value.items()))
    return int(raw) if kind == "N" else raw


class RequestLedger:
    """WSGI middleware: counts every DynamoDB request (throttled ones included) per
    operation, table, index and, for a Query, partition key value; ``GET REQUESTS_PATH``
    answers the counts. Bodies it cannot read are counted under the operation alone."""

    _PARTITION = re.compile(r"^\s*\(?\s*(#?[\w.]+)\s*=\s*(:\w+)")  # "#k = :k AND ..."

    def __init__(self, app: WSGIApp) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str, str, str]] = Counter()
        self._items: Counter[tuple[str, str, str, str, str]] = Counter()

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == REQUESTS_PATH:
            return _json("200 OK", {"requests": self.rows()}, start_response)
        op = _operation(environ)
        if op is not None:
            try:
                keys = self._keys(op, json.loads(_read_body(environ) or b"{}"))
            except (ValueError, AttributeError, TypeError):
                keys = [((op, "", "", "", ""), 1)]
            with self._lock:
                for key, items in keys:
                    self._counts[key] += 1
                    self._items[key] += items
        return self._app(environ, start_response)

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            fields = ("op", "table", "index", "partition", "select")
            return [{**dict(zip(fields, key, strict=True)), "n": n, "items": self._items[key]} for key, n in self._counts.items()]

    def _keys(self, op: str, body: Mapping[str, Any]) -> list[tuple[tuple[str, str, str, str, str], int]]:
        """(op, table, index, partition, select) and how many items it names; a batch
        or a transaction is counted once per table it touches."""
        if op in ("BatchGetItem", "BatchWriteItem"):
            out = []
            for table, spec in body.get("RequestItems", {}).items():
                items = spec.get("Keys", []) if isinstance(spec, Mapping) else spec
                out.append(((op, table, "", "", ""), len(items)))
            return out
        if op in ("TransactWriteItems", "TransactGetItems"):
            tables = Counter(next(iter(entry.values())).get("TableName", "") for entry in body.get("TransactItems", []))
            return [((op, table, "", "", ""), n) for table, n in tables.items()]
        partition = ""
        if op == "Query":
            match = self._PARTITION.match(body.get("KeyConditionExpression", ""))
            if match:
                value = body.get("ExpressionAttributeValues", {}).get(match.group(2), {})
                partition = next(iter(value.values()), "") if isinstance(value, Mapping) else ""
        return [((op, body.get("TableName", ""), body.get("IndexName", ""), str(partition), body.get("Select", "")), 1)]
