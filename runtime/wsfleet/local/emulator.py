"""A local AWS emulator: moto in server mode on loopback, with DynamoDB made atomic.

moto applies a conditional write as "read, check, write" without a lock, so two
concurrent requests can both pass the check (two winners of one lease, lost fence
increments). Real DynamoDB serialises writes per item. We restore that guarantee by
serialising every DynamoDB request inside the server; other services (SQS long polls
above all) stay concurrent.

Run standalone with ``python -m wsfleet.local.emulator`` (prints ``READY <url>``),
or embed with :class:`Emulator` in tests.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any, Callable, Iterable

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


def build_app() -> WSGIApp:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    return SerializedDynamoDB(DomainDispatcherApplication(create_backend_app))


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
