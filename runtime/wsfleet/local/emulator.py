"""A local AWS emulator: moto in server mode on loopback, with DynamoDB made atomic.

moto applies a conditional write as "read, check, write" without a lock, so two
concurrent requests can both pass the check (two winners of one lease, lost fence
increments). Real DynamoDB serialises writes per item. We restore that guarantee by
serialising every DynamoDB request inside the server; other services (SQS long polls
above all) stay concurrent.

Three paths of its own, beside the AWS APIs, for the benchmarks and chaos runs:

* ``/_wsfleet/faults``: fault injection, switched at run time. ``POST`` a setting, which
  replaces the previous one whole (a key left out is off):

  - ``{"throttle": 0.5, "seed": 7}`` answers half of all DynamoDB requests, picked at
    random, with DynamoDB's own ``ThrottlingException`` (HTTP 400); ``{"throttle":
    {"UpdateItem": 0.9, "*": 0.1}}`` sets shares per operation (``*``: every other one);
  - ``{"latency_ms": 200, "jitter_ms": 100}`` delays every DynamoDB request by 200-300 ms
    before it is handled (per operation too, as a mapping), outside the lock that
    serialises DynamoDB, so a slow request does not hold the others up;
  - ``{"outage": {"dynamodb": 8, "sqs": 5}}`` fails every request to that service for
    that many seconds from now: DynamoDB with ``InternalServerError`` (HTTP 500), SQS
    with ``ServiceUnavailable`` (HTTP 503), Secrets Manager (``"secretsmanager"``, the
    only fault it takes) with ``InternalServiceError`` (HTTP 500); with ``"outage_mode": "hang"`` a DynamoDB
    request is held until the outage ends, then failed, as a black-holed network does;
  - ``{"ambiguous": {"UpdateItem": 0.5, "TransactWriteItems": 1, "*": 0.1}, "seed": 7}``
    makes that share of requests *ambiguous*: the request is applied as usual (DynamoDB
    inside the lock that serialises it, journal included; an SQS message is sent, or
    received and hidden), then its answer is replaced by an HTTP 500
    (``InternalServerError``; SQS: ``InternalError``), which the SDKs retry as they would
    a timeout. ``*`` covers every other operation of both services. A request the service
    refused (a failed condition, say) was not applied, and keeps its own answer.

  ``{}`` switches everything off. ``GET`` answers the setting, the seconds of outage
  left, and per operation how many requests were failed (by an outage), throttled, made
  ambiguous, delayed and passed since the last POST: a DynamoDB request is counted once,
  under the first of these that applies; an SQS request only when failed or ambiguous.
  Requests whose User-Agent carries :data:`HARNESS_MARK` (the fleet runner's own reads:
  its observer and its audit) are never faulted: the faults are for the system under
  test, the evidence must not depend on them.
* ``/_wsfleet/requests``: ``GET`` answers every DynamoDB request received so far,
  counted per operation, table, index and (for a Query) the partition key value, so
  that a benchmark can split its client's counts by table and index partition.
* ``/_wsfleet/journal``: an independent history of the writes that matter to ownership,
  in the order the serialised DynamoDB applied them. Off until ``POST {"record": true}``
  (which also clears it); then every message stored (BatchWriteItem puts: key, fence,
  writer), every acquisition (a TransactWriteItems Update that sets ``fence_token``, or
  an UpdateItem that answered an item with one: key, fence, session) and every
  UpdateItem that answered an ENDED session (who ended it) is recorded with its position
  and the server's clock. ``GET ?since=N``
  answers the entries from position N.

Run standalone with ``python -m wsfleet.local.emulator`` (prints ``READY <url>``),
or embed with :class:`Emulator` in tests.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import re
import signal
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import parse_qs

from werkzeug.serving import make_server

from .. import schema
from ..logs import route_stdlib_logging
from .secrets import SECRET_PREFIX

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]

DEFAULT_REGION = "us-east-1"
TABLE_NAME = "wsfleet-connections"
SESSIONS_TABLE_NAME = "wsfleet-sessions"
MESSAGES_TABLE_NAME = "wsfleet-messages"
MESSAGES_BUCKET_NAME = "wsfleet-messages"
QUEUE_NAME = "wsfleet-start"
# moto accepts any credentials; these make boto3 sign requests without a profile.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
FAULTS_PATH = "/_wsfleet/faults"
REQUESTS_PATH = "/_wsfleet/requests"
JOURNAL_PATH = "/_wsfleet/journal"
# In a client's User-Agent (botocore ``user_agent_extra``): the fleet runner's own reads,
# never faulted.
HARNESS_MARK = "wsfleet-harness"
OUTAGE_SERVICES = ("dynamodb", "sqs", "secretsmanager")
AMBIGUOUS_SERVICES = ("dynamodb", "sqs")  # the ones whose writes matter to ownership
_DYNAMODB_TARGET = "DynamoDB_20120810."


class SerializedDynamoDB:
    """WSGI middleware: at most one DynamoDB request is handled at a time, and what it
    wrote is put in the :class:`Journal` (when recording) in that same order."""

    def __init__(self, app: WSGIApp, journal: "Journal | None" = None) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._journal = journal

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        op = _operation(environ)
        if op is None:
            return self._app(environ, start_response)
        journal = self._journal if self._journal is not None and self._journal.wants(op) else None
        if journal is None:
            with self._lock:
                # Materialise the body inside the lock: the write happens while moto
                # builds the response, not when the server sends it.
                return list(self._app(environ, start_response))
        request = _read_body(environ)
        status: list[str] = []

        def capture(code: str, headers: list, *exc: Any) -> Any:
            status.append(code)
            return start_response(code, headers, *exc)

        with self._lock:
            body = list(self._app(environ, capture))
            if status and status[0].startswith("200"):
                journal.record(op, request, b"".join(body))
        return body


def _operation(environ: dict) -> str | None:
    """The DynamoDB operation of a request ("UpdateItem"), None for other services."""
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    return target[len(_DYNAMODB_TARGET):] if target.startswith(_DYNAMODB_TARGET) else None


def _service(environ: dict) -> str:
    """The AWS service a request is signed for ("dynamodb", "sqs", ...), "" if unsigned."""
    match = re.search(r"Credential=[^/]*/[^/]*/[^/]*/([^/]+)/", environ.get("HTTP_AUTHORIZATION", ""))
    return match.group(1) if match else ""


def _json(status: str, body: Any, start_response: Callable) -> list[bytes]:
    raw = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(raw)))])
    return [raw]


def _read_body(environ: dict) -> bytes:
    """The request body, put back so that the next application can read it too."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    environ["wsgi.input"] = io.BytesIO(body)
    return body


def _shares(value: float | Mapping[str, float], what: str, top: float) -> dict[str, float]:
    """A number for every operation, or numbers by operation with ``*`` for the rest;
    zeros dropped. Raises ValueError naming ``what`` on a value outside 0..top."""
    shares = {"*": value} if isinstance(value, (int, float)) else dict(value)
    for op, share in shares.items():
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= top:
            raise ValueError(f"{what} of {op!r} must be a number from 0 to {top:g}, got {share!r}")
    return {op: float(share) for op, share in shares.items() if share}


@dataclass(frozen=True)
class FaultSetting:
    """What :class:`Faults` does, as POSTed (see the module docstring)."""

    throttle: Mapping[str, float] = field(default_factory=dict)  # share by operation, "*": the rest
    latency_ms: Mapping[str, float] = field(default_factory=dict)  # added delay by operation
    jitter_ms: float = 0.0  # up to this much more, at random
    outage: Mapping[str, float] = field(default_factory=dict)  # service -> seconds, from when it was set
    outage_mode: str = "error"  # error | hang (DynamoDB only)
    ambiguous: Mapping[str, float] = field(default_factory=dict)  # share applied then answered 500, by operation
    seed: int | None = None

    @classmethod
    def parse(cls, spec: Mapping[str, Any]) -> "FaultSetting":
        if not isinstance(spec, Mapping):
            raise ValueError("the fault setting must be a JSON object")
        unknown = set(spec) - {"throttle", "latency_ms", "jitter_ms", "outage", "outage_mode", "ambiguous", "seed"}
        if unknown:
            raise ValueError(f"unknown fault settings: {', '.join(sorted(unknown))}")
        outage = spec.get("outage") or {}
        if not isinstance(outage, Mapping) or not set(outage) <= set(OUTAGE_SERVICES):
            raise ValueError(f"outage must map some of {', '.join(OUTAGE_SERVICES)} to seconds")
        mode = spec.get("outage_mode", "error")
        if mode not in ("error", "hang"):
            raise ValueError(f"outage_mode must be error or hang, got {mode!r}")
        jitter = spec.get("jitter_ms", 0)
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter <= 60_000:
            raise ValueError(f"jitter_ms must be a number from 0 to 60000, got {jitter!r}")
        return cls(
            throttle=_shares(spec.get("throttle", 0), "throttle share", 1),
            latency_ms=_shares(spec.get("latency_ms", 0), "latency_ms", 60_000),
            jitter_ms=float(jitter),
            outage=_shares(outage, "outage seconds", 3600),
            outage_mode=mode,
            ambiguous=_shares(spec.get("ambiguous", 0), "ambiguous share", 1),
            seed=spec.get("seed"),
        )


class Faults:
    """WSGI middleware: DynamoDB throttling, added latency and outages, SQS outages, and
    ambiguous requests of both, switched at run time through ``FAULTS_PATH`` (see the
    module docstring). Requests marked with :data:`HARNESS_MARK` pass untouched."""

    def __init__(self, app: WSGIApp) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._setting = FaultSetting()
        self._outage_until: dict[str, float] = {}  # service -> monotonic end
        self._rng = random.Random()
        self._counts: dict[str, Counter[str]] = {
            k: Counter() for k in ("throttled", "delayed", "failed", "ambiguous", "passed")
        }

    def set(self, setting: FaultSetting) -> None:
        """Replace the setting; resets the counts."""
        now = time.monotonic()
        with self._lock:
            self._setting = setting
            self._outage_until = {service: now + s for service, s in setting.outage.items()}
            self._rng = random.Random(setting.seed)
            for counter in self._counts.values():
                counter.clear()

    def state(self) -> dict[str, Any]:
        now = time.monotonic()
        with self._lock:
            s = self._setting
            return {
                "throttle": dict(s.throttle), "latency_ms": dict(s.latency_ms), "jitter_ms": s.jitter_ms,
                "outage": dict(s.outage), "outage_mode": s.outage_mode, "ambiguous": dict(s.ambiguous), "seed": s.seed,
                "outage_left_s": {k: round(end - now, 3) for k, end in self._outage_until.items() if end > now},
                **{name: dict(counter) for name, counter in self._counts.items()},
            }

    def _decide(self, service: str, op: str) -> tuple[str, float, bool]:
        """(what to do, seconds, lose the answer): ("outage", until, False) |
        ("throttle", 0, False) | ("delay", s, ambiguous) | ("pass", 0, ambiguous). An
        ambiguous request is counted once its answer is known (:meth:`_lose_answer`)."""
        with self._lock:
            s = self._setting
            until = self._outage_until.get(service, 0.0)
            if until > time.monotonic():
                self._counts["failed"][op] += 1
                return "outage", until, False
            delay = 0.0
            if service == "dynamodb":
                share = s.throttle.get(op, s.throttle.get("*", 0.0))
                if share > 0 and self._rng.random() < share:
                    self._counts["throttled"][op] += 1
                    return "throttle", 0.0, False
                delay = s.latency_ms.get(op, s.latency_ms.get("*", 0.0))
                if delay > 0 or s.jitter_ms > 0:
                    delay += s.jitter_ms * self._rng.random()
            share = s.ambiguous.get(op, s.ambiguous.get("*", 0.0)) if service in AMBIGUOUS_SERVICES else 0.0
            ambiguous = share > 0 and self._rng.random() < share
            if service == "dynamodb" and not ambiguous:
                self._counts["delayed" if delay > 0 else "passed"][op] += 1
            return ("delay", delay / 1000, ambiguous) if delay > 0 else ("pass", 0.0, ambiguous)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == FAULTS_PATH:
            return self._control(environ, start_response)
        service = _service(environ)
        op = _operation(environ) or environ.get("HTTP_X_AMZ_TARGET", "").rpartition(".")[2] or service
        if service not in OUTAGE_SERVICES or HARNESS_MARK in environ.get("HTTP_USER_AGENT", ""):
            return self._app(environ, start_response)
        what, value, ambiguous = self._decide(service, op)
        if what == "delay":
            time.sleep(value)  # before the DynamoDB lock is taken: others go on meanwhile
        if what in ("pass", "delay"):
            if ambiguous:
                return self._lose_answer(environ, start_response, service, op, delayed=what == "delay")
            return self._app(environ, start_response)
        _read_body(environ)  # a client sending a body expects it to be read
        if what == "throttle":
            return self._error(start_response, "400 Bad Request", "com.amazonaws.dynamodb.v20120810#ThrottlingException",
                               "Rate of requests exceeds the allowed throughput.")
        if service == "sqs":
            return self._error(start_response, "503 Service Unavailable", "com.amazonaws.sqs#ServiceUnavailable",
                               "The request has failed due to a temporary failure of the server.")
        if self._setting.outage_mode == "hang":
            time.sleep(max(0.0, value - time.monotonic()))
        return self._internal_error(start_response, service)

    def _lose_answer(
        self, environ: dict, start_response: Callable, service: str, op: str, *, delayed: bool
    ) -> Iterable[bytes]:
        """Apply the request, then answer a 500 in place of what the service answered,
        as when a response is lost on the way back. A request the service refused was
        not applied: it keeps its own answer (and is counted as delayed or passed)."""
        answer: list[tuple[str, list]] = []
        written: list[bytes] = []

        def capture(status: str, headers: list, *exc: Any) -> Callable[[bytes], None]:
            answer[:] = [(status, headers)]
            return written.append

        body = written + list(self._app(environ, capture))  # the whole answer: the write is done
        status, headers = answer[0]
        applied = status.startswith("2")
        if applied or service == "dynamodb":
            with self._lock:
                self._counts["ambiguous" if applied else "delayed" if delayed else "passed"][op] += 1
        if applied:
            return self._internal_error(start_response, service)
        start_response(status, headers)
        return body

    def _internal_error(self, start_response: Callable, service: str) -> list[bytes]:
        if service == "secretsmanager":
            return self._error(start_response, "500 Internal Server Error", "InternalServiceError",
                               "An error occurred on the server side.")
        if service == "sqs":
            return self._error(start_response, "500 Internal Server Error", "com.amazonaws.sqs#InternalError",
                               "We encountered an internal error. Please try again.")
        return self._error(start_response, "500 Internal Server Error", "com.amazonaws.dynamodb.v20120810#InternalServerError",
                           "Internal server error")

    def _error(self, start_response: Callable, status: str, kind: str, message: str) -> list[bytes]:
        body = json.dumps({"__type": kind, "message": message}).encode()
        start_response(status, [
            ("Content-Type", "application/x-amz-json-1.0"),
            ("Content-Length", str(len(body))),
            ("x-amzn-RequestId", f"wsfleet-fault-{random.getrandbits(32):08x}"),
        ])
        return [body]

    def _control(self, environ: dict, start_response: Callable) -> list[bytes]:
        if environ.get("REQUEST_METHOD") == "POST":
            try:
                self.set(FaultSetting.parse(json.loads(_read_body(environ) or b"{}")))
            except (ValueError, AttributeError, TypeError) as exc:
                return _json("400 Bad Request", {"error": "bad_request", "message": str(exc)}, start_response)
        return _json("200 OK", self.state(), start_response)


class Journal:
    """The writes that decide ownership and data, in the order DynamoDB applied them
    (recorded by :class:`SerializedDynamoDB` inside its lock). Off until switched on."""

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
        else:
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


def _assignments(update: Mapping[str, Any]) -> dict[str, Any]:
    """The ``SET name = :value`` parts of an Update's expression, as plain values by
    attribute name (other clauses and computed values are left out)."""
    names = update.get("ExpressionAttributeNames") or {}
    values = update.get("ExpressionAttributeValues") or {}
    set_clause = re.split(r"\b(?:REMOVE|ADD|DELETE)\b", update.get("UpdateExpression", ""))[0]
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


def _partition_queries() -> None:
    """Make moto read one partition for a Query on a table's own key, as DynamoDB does.

    moto 5.2 answers such a Query by listing and sorting every item of the table, then
    keeping the partition's: O(table) per request, inside the lock that serialises
    DynamoDB. A long run's messages table holds 100,000s of rows, and every takeover reads
    where a stream's stored messages end: queries of a second each, renewals stuck behind
    them past their timeout, sessions lost, more takeovers. The partition's items (those
    the sort key condition keeps) are exactly what moto keeps of that list, so the answer
    is the same. Idempotent."""
    from moto.dynamodb.models.table import Table

    if getattr(Table.query, "_wsfleet_partition", False):
        return
    query = Table.query

    def partition_query(self: Any, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        index_name = args[6] if len(args) > 6 else kwargs.get("index_name")
        if index_name or hash_key is None or not self.range_key_attr:
            return query(self, hash_key, *args, **kwargs)
        partition = list(self.items.get(hash_key, {}).values())
        comparison, values = (args[0], args[1]) if len(args) > 1 else (kwargs.get("range_comparison"), kwargs.get("range_objs"))
        if comparison:
            # The sort key condition, with moto's own comparison (moto applies it again):
            # otherwise moto sizes every item of the partition before it filters them.
            partition = [i for i in partition if i.range_key is not None and i.range_key.compare(comparison, values)]
        self.all_items = lambda: partition  # the instance attribute shadows the method for this call
        try:
            return query(self, hash_key, *args, **kwargs)
        finally:
            del self.all_items

    partition_query._wsfleet_partition = True  # type: ignore[attr-defined]
    Table.query = partition_query


def _visible_again_wakes_long_polls() -> None:
    """Make a message made visible again by ChangeMessageVisibility wake the long polls
    waiting on its queue, as SQS does (a long poll returns as soon as a message is
    available). moto 5.2 wakes them only when a message is sent, and a message put back
    with visibility 0 only becomes visible once its millisecond has passed (visible
    means "now > visible_at"): a poll woken in that millisecond went back to sleep. It
    waited up to a second, each time, for a waiting poll's next look. Idempotent."""
    from moto.core.utils import unix_time_millis
    from moto.sqs.models import SQSBackend

    if getattr(SQSBackend.change_message_visibility, "_wsfleet_wakes", False):
        return
    change = SQSBackend.change_message_visibility

    def change_and_wake(self: Any, queue_name: str, receipt_handle: str, visibility_timeout: int) -> None:
        change(self, queue_name, receipt_handle, visibility_timeout)
        if int(visibility_timeout) == 0:
            queue = self.get_queue(queue_name)
            with queue._messages_lock:
                for message in queue._messages:
                    if message.had_receipt_handle(receipt_handle):
                        message.visible_at = min(message.visible_at, unix_time_millis() - 1)
                        queue.pending_messages.discard(message)
                queue._messages_lock.notify_all()

    change_and_wake._wsfleet_wakes = True  # type: ignore[attr-defined]
    SQSBackend.change_message_visibility = change_and_wake


def _transactions_copy_items_not_tables() -> None:
    """Make moto back up the items a TransactWriteItems targets, not whole tables.

    moto 5.2 deep-copies the whole table for every entry of a transaction, to roll back
    if one fails: with 1,000 connections one copy takes some 36 ms, so a checkpoint of 25
    Updates took a second (100: four) inside the lock that serialises DynamoDB, and every
    other request waited behind it. A transaction can only change the items it names, so
    a copy of those is as good a backup. We take it, make moto's whole-table copy return
    the table itself for the call (the module's ``copy`` swapped for a shim: safe, as every
    DynamoDB request runs under :class:`SerializedDynamoDB`'s lock; moto's rollback then
    puts the same table back), and on any exception put the copies back, last first (the
    first copy of an item named twice is the one from before), then re-raise. The copies
    are re-inserted as the stored objects: moto's update mutates the stored Item in place.
    moto checks, applies and answers exactly as before (the same errors, in the same
    order). An entry whose table or key we cannot resolve, or a table with a stream
    (moto's rollback also takes back its stream records), gets moto's own method
    unchanged. Idempotent."""
    import copy
    import types

    import moto.dynamodb.models as models
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import Table

    if getattr(DynamoDBBackend.transact_write_items, "_wsfleet_item_copies", False):
        return
    transact = DynamoDBBackend.transact_write_items

    def deepcopy(value: Any, memo: dict[int, Any] | None = None) -> Any:
        return value if isinstance(value, Table) else copy.deepcopy(value, memo)

    shim = types.SimpleNamespace(**{**vars(copy), "deepcopy": deepcopy})
    Snapshot = tuple[Table, Any, Any, Any, bool]  # table, hash, range (None: no sort key), item or None, partition existed

    def snapshot(self: Any, entry: Mapping[str, Any]) -> Snapshot | None:
        """The targeted item as it is now (a deep copy), None if it cannot be resolved."""
        if len(entry) != 1:
            return None
        op_type, op = next(iter(entry.items()))
        if op_type not in ("Put", "Update", "Delete", "ConditionCheck") or not isinstance(op, Mapping):
            return None
        table = self.tables.get(op.get("TableName"))
        if table is None or table.stream_shard is not None:
            return None
        key = op.get("Item" if op_type == "Put" else "Key")
        if not isinstance(key, Mapping) or table.hash_key_attr not in key:
            return None
        hash_value = DynamoType(key[table.hash_key_attr])
        if table.range_key_attr is None:
            item = table.items.get(hash_value)
            return table, hash_value, None, copy.deepcopy(item), True
        if table.range_key_attr not in key:
            return None
        range_value = DynamoType(key[table.range_key_attr])
        existed = hash_value in table.items
        item = table.items[hash_value].get(range_value) if existed else None
        return table, hash_value, range_value, copy.deepcopy(item), existed

    def restore(snapshots: list[Snapshot]) -> None:
        for table, hash_value, range_value, item, existed in reversed(snapshots):
            if range_value is None:
                if item is None:
                    table.items.pop(hash_value, None)
                else:
                    table.items[hash_value] = item
                continue
            partition = table.items[hash_value]
            if item is None:
                partition.pop(range_value, None)
            else:
                partition[range_value] = item
            if not existed and not partition:
                # moto's reads create the partition (items is a defaultdict); it was not there
                del table.items[hash_value]

    def transact_with_item_copies(self: Any, transact_items: list[dict[str, Any]]) -> None:
        try:
            snapshots = [snapshot(self, entry) for entry in transact_items]
        except Exception:  # a key moto refuses (an unhashable type, ...): let it say so
            snapshots = [None]
        if len(transact_items) > 100 or not all(snapshots):  # moto refuses these before it copies
            return transact(self, transact_items)
        swapped = models.copy
        models.copy = shim
        try:
            return transact(self, transact_items)
        except BaseException:
            restore(snapshots)  # type: ignore[arg-type]
            raise
        finally:
            models.copy = swapped

    transact_with_item_copies._wsfleet_item_copies = True  # type: ignore[attr-defined]
    DynamoDBBackend.transact_write_items = transact_with_item_copies


def build_app() -> WSGIApp:
    """moto behind the ledger (outermost: it sees every request), the journal's control
    path, the fault switch, and the lock that serialises DynamoDB (and journals it)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    _partition_queries()
    _visible_again_wakes_long_polls()
    _transactions_copy_items_not_tables()
    book = Journal()
    return RequestLedger(book(Faults(SerializedDynamoDB(DomainDispatcherApplication(create_backend_app), book))))


def _post(url: str, body: Mapping[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def set_faults(
    endpoint_url: str,
    *,
    throttle: float | Mapping[str, float] = 0,
    latency_ms: float | Mapping[str, float] = 0,
    jitter_ms: float = 0,
    outage: Mapping[str, float] | None = None,
    outage_mode: str = "error",
    ambiguous: float | Mapping[str, float] = 0,
    seed: int | None = None,
) -> dict[str, Any]:
    """Replace the emulator's fault setting (see :class:`Faults`; no argument: all off);
    returns its new state."""
    return _post(endpoint_url + FAULTS_PATH, {
        "throttle": throttle, "latency_ms": latency_ms, "jitter_ms": jitter_ms,
        "outage": dict(outage or {}), "outage_mode": outage_mode, "ambiguous": ambiguous, "seed": seed,
    })


def faults(endpoint_url: str) -> dict[str, Any]:
    """The emulator's fault setting and counts since it was last set."""
    with urllib.request.urlopen(endpoint_url + FAULTS_PATH, timeout=10) as resp:
        return json.load(resp)


def record_journal(endpoint_url: str, record: bool = True) -> None:
    """Start (clearing it) or stop the emulator's write journal (see :class:`Journal`)."""
    _post(endpoint_url + JOURNAL_PATH, {"record": record})


def journal(endpoint_url: str) -> list[dict[str, Any]]:
    """Every journal entry recorded so far, in the order DynamoDB applied the writes."""
    out: list[dict[str, Any]] = []
    while True:
        with urllib.request.urlopen(f"{endpoint_url}{JOURNAL_PATH}?since={len(out)}", timeout=30) as resp:
            page = json.load(resp)
        out.extend(page["entries"])
        if not page["entries"] or len(out) >= page["total"]:
            return out


def request_ledger(endpoint_url: str) -> list[dict[str, Any]]:
    """Every DynamoDB request the emulator received so far (see :class:`RequestLedger`)."""
    with urllib.request.urlopen(endpoint_url + REQUESTS_PATH, timeout=10) as resp:
        return json.load(resp)["requests"]


FREEZE_EVERY_S = 2.0


def freeze_survivors(stop: threading.Event, every_s: float = FREEZE_EVERY_S) -> None:
    """Every ``every_s``, move every object alive to the garbage collector's permanent
    generation (``gc.freeze``, O(1)), so that a full collection only looks at what is new.

    moto keeps each stored message as a dozen Python objects: a run's messages table of
    60,000 rows is ~790,000 objects, and one full collection of them took 353 ms (0.0 ms
    after ``gc.freeze()``; 2,400 BatchWriteItems of 25 into moto in one process, then
    ``gc.collect(2)``), with the GIL held and every request of the server waiting. In the
    ingestion benchmark's 1000 x 0.5/s row a frame's received -> stored time jumped from
    ~80 ms to 500-800 ms every 20-35 s, each time the table had grown by a quarter (what
    triggers a full collection). Stored rows are not cyclic garbage; what this gives up
    is only collecting cycles among objects that were alive at a freeze and die later (a
    request in flight at that instant): a small, bounded leak for a test server."""
    import gc

    while not stop.wait(every_s):
        gc.freeze()


class Emulator:
    """moto server on a free loopback port, in a background thread of this process.
    ``freeze_gc``: run :func:`freeze_survivors` beside it (the standalone server does;
    an emulator embedded in a test process leaves that process's collector alone)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, freeze_gc: bool = False) -> None:
        from moto.moto_server.werkzeug_app import MotoRequestHandler

        class QuietHandler(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                """One line per request would drown the fleet's own logs."""

        self._server = make_server(host, port, build_app(), threaded=True, request_handler=QuietHandler)
        # Stops within 50 ms (the local API's interval too): tests start and stop many.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="moto-server", daemon=True
        )
        self._stop = threading.Event()
        self._freezer = (
            threading.Thread(target=freeze_survivors, args=(self._stop,), name="gc-freezer", daemon=True)
            if freeze_gc else None
        )

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "Emulator":
        self._thread.start()
        if self._freezer is not None:
            self._freezer.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._thread.join(timeout=10)
        self._server.server_close()

    def __enter__(self) -> "Emulator":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def emulator_session(region: str = DEFAULT_REGION) -> Any:
    """A boto3 session that signs with :data:`CREDENTIALS`, whatever this process's own
    environment holds: for clients of the emulator, and for URLs presigned for it."""
    import boto3

    return boto3.session.Session(
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=region,
    )


def create_resources(
    endpoint_url: str,
    *,
    region: str = DEFAULT_REGION,
    table_name: str = TABLE_NAME,
    sessions_table_name: str = SESSIONS_TABLE_NAME,
    messages_table_name: str = MESSAGES_TABLE_NAME,
    messages_bucket_name: str = MESSAGES_BUCKET_NAME,
    queue_name: str = QUEUE_NAME,
) -> dict[str, str]:
    """Create the tables (from :mod:`wsfleet.schema`), the bucket and the queue; return the
    environment variables the worker and the router need to reach them (Secrets Manager
    answers on the same endpoint: secrets under :data:`secrets.SECRET_PREFIX` are allowed
    in ``secret_headers``, see :func:`secrets.put_secret`)."""
    session = emulator_session(region)
    ddb = session.client("dynamodb", endpoint_url=endpoint_url)
    ddb.create_table(**schema.connections_table_spec(table_name))
    ddb.create_table(**schema.sessions_table_spec(sessions_table_name))
    ddb.update_time_to_live(
        TableName=sessions_table_name, TimeToLiveSpecification={"Enabled": True, "AttributeName": schema.SESSION_TTL}
    )
    ddb.create_table(**schema.messages_table_spec(messages_table_name))
    sqs = session.client("sqs", endpoint_url=endpoint_url)
    queue_url = sqs.create_queue(QueueName=queue_name, Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
    s3 = session.client("s3", endpoint_url=endpoint_url)
    if region == "us-east-1":
        s3.create_bucket(Bucket=messages_bucket_name)
    else:
        s3.create_bucket(Bucket=messages_bucket_name, CreateBucketConfiguration={"LocationConstraint": region})
    return {
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_REGION": region,
        **CREDENTIALS,
        "TABLE_NAME": table_name,
        "SESSIONS_TABLE_NAME": sessions_table_name,
        "MESSAGES_TABLE_NAME": messages_table_name,
        "MESSAGES_BUCKET_NAME": messages_bucket_name,
        "QUEUE_URL": queue_url,
        "UPSTREAM_SECRET_PREFIX": SECRET_PREFIX,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--create", action="store_true", help="create the tables and queue, print their env as JSON")
    args = parser.parse_args(argv)
    route_stdlib_logging(component="emulator")
    emulator = Emulator(args.host, args.port, freeze_gc=True).start()
    print(f"READY {emulator.endpoint_url}", flush=True)
    if args.create:
        print(json.dumps(create_resources(emulator.endpoint_url)), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
