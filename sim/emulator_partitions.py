"""DynamoDB's write limit per partition, in the emulator.

DynamoDB serves each partition on its own: one partition takes at most 1,000 write units
a second, and a connection writing faster than that is throttled in its partition while
every other request goes on as before. The emulator serialises every DynamoDB request
under one lock and serves a few hundred items a second in all, so without a limit one
hot connection (a peer faster than the store) takes that whole capacity and every
renewal, acquire and checkpoint of the fleet waits behind its batches: stricter than
DynamoDB, and not the way DynamoDB is strict.

:class:`PartitionWrites` holds each partition of a ``BatchWriteItem`` (its items' ``pk``:
a connection's messages) to ``per_s`` items a second (a token bucket holding one second
of them; items, not DynamoDB's KB: what the emulator's time goes by, and a large item
scaled down with the limit would stall its partition for seconds where DynamoDB takes a
fraction of one), as DynamoDB does at its limit: the items over it are not applied and come back in
``UnprocessedItems``; a request none of whose items fits is refused whole with
``ProvisionedThroughputExceededException`` (HTTP 400). Off (0) unless the emulator is
started with ``--partition-writes-per-s``: a run sets it in proportion to what its
emulator serves (the chaos run does), as DynamoDB's 1,000 are to a table's.
"""

from __future__ import annotations

import io
import json
import threading
import time
from typing import Callable, Iterable

from wsfleet.schema import MSG_PK

from .emulator_wsgi import WSGIApp, answer_of, aws_error
from .emulator_wsgi import json_response as _json
from .emulator_wsgi import operation as _operation
from .emulator_wsgi import read_body as _read_body

THROUGHPUT_EXCEEDED = "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException"


class PartitionWrites:
    """WSGI middleware: at most ``per_s`` items a second per partition of a
    BatchWriteItem (see the module docstring); ``throttled`` counts the items held back."""

    def __init__(self, app: WSGIApp, per_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._app = app
        self.per_s = per_s
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}  # (table, pk) -> (tokens, at)
        self.throttled = 0

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if self.per_s <= 0 or _operation(environ) != "BatchWriteItem":
            return self._app(environ, start_response)
        request = json.loads(_read_body(environ) or b"{}")
        kept, held = self._split(request.get("RequestItems") or {})
        if not held:
            return self._app(environ, start_response)
        if not kept:
            return aws_error(start_response, "400 Bad Request", THROUGHPUT_EXCEEDED,
                             "The level of configured provisioned throughput for the table was exceeded.")
        body = json.dumps({**request, "RequestItems": kept}).encode()
        environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
        status, headers, raw = answer_of(self._app, environ)
        if not status.startswith("200"):
            start_response(status, headers)
            return [raw]
        doc = json.loads(raw or b"{}")
        unprocessed = doc.setdefault("UnprocessedItems", {})
        for table, requests in held.items():
            unprocessed.setdefault(table, []).extend(requests)
        return _json("200 OK", doc, start_response)

    def _split(self, items: dict[str, list]) -> tuple[dict[str, list], dict[str, list]]:
        """The requests that fit their partition's bucket now (taking a token each), and
        those that do not."""
        kept: dict[str, list] = {}
        held: dict[str, list] = {}
        now = self._clock()
        with self._lock:
            for table, requests in items.items():
                for r in requests:
                    item = (r.get("PutRequest") or {}).get("Item") or (r.get("DeleteRequest") or {}).get("Key") or {}
                    pk = json.dumps(item.get(MSG_PK), sort_keys=True)
                    tokens, at = self._buckets.get((table, pk), (self.per_s, now))
                    tokens = min(self.per_s, tokens + (now - at) * self.per_s)
                    if tokens >= 1:
                        kept.setdefault(table, []).append(r)
                        tokens -= 1
                    else:
                        held.setdefault(table, []).append(r)
                        self.throttled += 1
                    self._buckets[(table, pk)] = (tokens, now)
        return kept, held
