"""A local AWS emulator: moto in server mode on loopback, with DynamoDB made atomic.

moto applies a conditional write as "read, check, write" without a lock, so two
concurrent requests can both pass the check (two winners of one lease, lost fence
increments). Real DynamoDB serialises writes per item. We restore that guarantee by
serialising every DynamoDB request inside the server; other services (SQS long polls
above all) stay concurrent.

Two paths of its own, beside the AWS APIs, for the benchmarks and chaos runs:

* ``/_wsfleet/faults``: fault injection. ``POST {"throttle": 0.5, "seed": 7}`` answers
  half of all DynamoDB requests, picked at random, with DynamoDB's own
  ``ThrottlingException`` (HTTP 400) until the next POST; ``{"throttle": {"UpdateItem":
  0.9, "*": 0.1}}`` sets shares per operation (``*``: every other one); ``{"throttle":
  0}`` switches it off. ``GET`` answers the settings and, per operation, how many
  requests were throttled and passed since the last POST.
* ``/_wsfleet/requests``: ``GET`` answers every DynamoDB request received so far,
  counted per operation, table, index and (for a Query) the partition key value, so
  that a benchmark can split its client's counts by table and index partition.

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
import urllib.request
from collections import Counter
from typing import Any, Callable, Iterable, Mapping

from werkzeug.serving import make_server

from .. import schema
from ..logs import route_stdlib_logging

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]

DEFAULT_REGION = "us-east-1"
TABLE_NAME = "wsfleet-connections"
SESSIONS_TABLE_NAME = "wsfleet-sessions"
MESSAGES_TABLE_NAME = "wsfleet-messages"
QUEUE_NAME = "wsfleet-start"
# moto accepts any credentials; these make boto3 sign requests without a profile.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
FAULTS_PATH = "/_wsfleet/faults"
REQUESTS_PATH = "/_wsfleet/requests"
_DYNAMODB_TARGET = "DynamoDB_20120810."


class SerializedDynamoDB:
    """WSGI middleware: at most one DynamoDB request is handled at a time."""

    def __init__(self, app: WSGIApp) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if not target.startswith("DynamoDB_"):
            return self._app(environ, start_response)
        with self._lock:
            # Materialise the body inside the lock: the write happens while moto
            # builds the response, not when the server sends it.
            return list(self._app(environ, start_response))


def _operation(environ: dict) -> str | None:
    """The DynamoDB operation of a request ("UpdateItem"), None for other services."""
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    return target[len(_DYNAMODB_TARGET):] if target.startswith(_DYNAMODB_TARGET) else None


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


class Faults:
    """WSGI middleware: answers a configurable share of DynamoDB requests with a
    ``ThrottlingException``, as DynamoDB does when a table or partition is over its
    limits, without passing them on. Switched at run time through ``FAULTS_PATH``."""

    def __init__(self, app: WSGIApp) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._shares: dict[str, float] = {}
        self._rng = random.Random()
        self._seed: int | None = None
        self._throttled: Counter[str] = Counter()
        self._passed: Counter[str] = Counter()

    def set(self, throttle: float | Mapping[str, float], seed: int | None = None) -> None:
        """A share (0..1) for every operation, or shares by operation name with ``*``
        for the rest. Resets the counts."""
        shares = {"*": throttle} if isinstance(throttle, (int, float)) else dict(throttle)
        for op, share in shares.items():
            if not isinstance(share, (int, float)) or not 0 <= share <= 1:
                raise ValueError(f"throttle share of {op!r} must be a number from 0 to 1, got {share!r}")
        with self._lock:
            self._shares = {op: float(share) for op, share in shares.items() if share}
            self._seed = seed
            self._rng = random.Random(seed)
            self._throttled.clear()
            self._passed.clear()

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"throttle": dict(self._shares), "seed": self._seed,
                    "throttled": dict(self._throttled), "passed": dict(self._passed)}

    def _throttle(self, op: str) -> bool:
        with self._lock:
            share = self._shares.get(op, self._shares.get("*", 0.0))
            hit = share > 0 and self._rng.random() < share
            (self._throttled if hit else self._passed)[op] += 1
            return hit

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == FAULTS_PATH:
            return self._control(environ, start_response)
        op = _operation(environ)
        if op is None or not self._throttle(op):
            return self._app(environ, start_response)
        _read_body(environ)  # a client sending a body expects it to be read
        body = json.dumps({
            "__type": "com.amazonaws.dynamodb.v20120810#ThrottlingException",
            "message": "Rate of requests exceeds the allowed throughput.",
        }).encode()
        start_response("400 Bad Request", [
            ("Content-Type", "application/x-amz-json-1.0"),
            ("Content-Length", str(len(body))),
            ("x-amzn-RequestId", f"wsfleet-throttled-{self._rng.getrandbits(32):08x}"),
        ])
        return [body]

    def _control(self, environ: dict, start_response: Callable) -> list[bytes]:
        if environ.get("REQUEST_METHOD") == "POST":
            try:
                spec = json.loads(_read_body(environ) or b"{}")
                self.set(spec.get("throttle", 0), spec.get("seed"))
            except (ValueError, AttributeError, TypeError) as exc:
                return _json("400 Bad Request", {"error": "bad_request", "message": str(exc)}, start_response)
        return _json("200 OK", self.state(), start_response)


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
        is counted once per table it touches."""
        if op in ("BatchGetItem", "BatchWriteItem"):
            out = []
            for table, spec in body.get("RequestItems", {}).items():
                items = spec.get("Keys", []) if isinstance(spec, Mapping) else spec
                out.append(((op, table, "", "", ""), len(items)))
            return out
        partition = ""
        if op == "Query":
            match = self._PARTITION.match(body.get("KeyConditionExpression", ""))
            if match:
                value = body.get("ExpressionAttributeValues", {}).get(match.group(2), {})
                partition = next(iter(value.values()), "") if isinstance(value, Mapping) else ""
        return [((op, body.get("TableName", ""), body.get("IndexName", ""), str(partition), body.get("Select", "")), 1)]


def build_app() -> WSGIApp:
    """moto behind the ledger (outermost: it sees every request), the fault switch,
    and the lock that serialises DynamoDB."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    return RequestLedger(Faults(SerializedDynamoDB(DomainDispatcherApplication(create_backend_app))))


def set_faults(endpoint_url: str, *, throttle: float | Mapping[str, float], seed: int | None = None) -> dict[str, Any]:
    """Switch the emulator's throttling (see :class:`Faults`); returns its new state."""
    body = json.dumps({"throttle": throttle, "seed": seed}).encode()
    req = urllib.request.Request(endpoint_url + FAULTS_PATH, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def faults(endpoint_url: str) -> dict[str, Any]:
    """The emulator's throttling settings and counts since they were last set."""
    with urllib.request.urlopen(endpoint_url + FAULTS_PATH, timeout=10) as resp:
        return json.load(resp)


def request_ledger(endpoint_url: str) -> list[dict[str, Any]]:
    """Every DynamoDB request the emulator received so far (see :class:`RequestLedger`)."""
    with urllib.request.urlopen(endpoint_url + REQUESTS_PATH, timeout=10) as resp:
        return json.load(resp)["requests"]


class Emulator:
    """moto server on a free loopback port, in a background thread of this process."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        from moto.moto_server.werkzeug_app import MotoRequestHandler

        class QuietHandler(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                """One line per request would drown the fleet's own logs."""

        self._server = make_server(host, port, build_app(), threaded=True, request_handler=QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto-server", daemon=True)

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "Emulator":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)
        self._server.server_close()

    def __enter__(self) -> "Emulator":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def create_resources(
    endpoint_url: str,
    *,
    region: str = DEFAULT_REGION,
    table_name: str = TABLE_NAME,
    sessions_table_name: str = SESSIONS_TABLE_NAME,
    messages_table_name: str = MESSAGES_TABLE_NAME,
    queue_name: str = QUEUE_NAME,
) -> dict[str, str]:
    """Create the tables (from :mod:`wsfleet.schema`) and the queue; return the
    environment variables the worker and the router need to reach them."""
    import boto3

    session = boto3.session.Session(
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=region,
    )
    ddb = session.client("dynamodb", endpoint_url=endpoint_url)
    ddb.create_table(**schema.connections_table_spec(table_name))
    ddb.create_table(**schema.sessions_table_spec(sessions_table_name))
    ddb.update_time_to_live(
        TableName=sessions_table_name, TimeToLiveSpecification={"Enabled": True, "AttributeName": schema.SESSION_TTL}
    )
    ddb.create_table(**schema.messages_table_spec(messages_table_name))
    sqs = session.client("sqs", endpoint_url=endpoint_url)
    queue_url = sqs.create_queue(QueueName=queue_name, Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
    return {
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_REGION": region,
        **CREDENTIALS,
        "TABLE_NAME": table_name,
        "SESSIONS_TABLE_NAME": sessions_table_name,
        "MESSAGES_TABLE_NAME": messages_table_name,
        "QUEUE_URL": queue_url,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--create", action="store_true", help="create the tables and queue, print their env as JSON")
    args = parser.parse_args(argv)
    route_stdlib_logging(component="emulator")
    emulator = Emulator(args.host, args.port).start()
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
