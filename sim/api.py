"""A local stand-in for API Gateway (REST API, Lambda proxy integration) on loopback.

Each HTTP request becomes a proxy event for a Lambda-style handler ``(event, context)``,
and the handler's proxy response becomes the HTTP response, so the event router can be
driven with curl exactly as it is behind API Gateway::

    python -m sim.api --port 8080      # prints READY http://127.0.0.1:8080
    curl -X POST localhost:8080/events -d '{"event_type": "STOP", "connection_id": "c1"}'

The process reads the router's variables (TABLE_NAME, QUEUE_URL, AWS_ENDPOINT_URL,
AWS_REGION, ALLOWED_WS_HOSTS, STATE_SHARDS) through :class:`wsfleet.config.RouterConfig`
and fails at start-up, naming the variable, when one is bad.

What it mimics: the resources ``/events``, ``/connections/{connection_id}`` and
``/connections/{connection_id}/messages``, with the query string in
``queryStringParameters`` and ``multiValueQueryStringParameters`` (decoded); any other path is still handed to the handler, with ``resource`` set to the raw path (a
greedy proxy resource would do the same), so the router answers the 404. Path
parameters are passed as they appear in the URL (not percent-decoded). A handler that
raises or returns a malformed response is answered 502 ``{"message": "Internal server
error"}``, as API Gateway does. What it does not: stages, authorizers, throttling,
the 29 s integration timeout, chunked request bodies (411).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import parse_qsl, urlsplit

from wsfleet import router
from wsfleet.settings_spec import ConfigError
from wsfleet.logs import JsonLogger, route_stdlib_logging

# The router's resources (its route templates), as the stack's API declares them.
EVENTS_RESOURCE = router.EVENTS
CONNECTION_RESOURCE = router.CONNECTION
MESSAGES_RESOURCE = router.MESSAGES
MAX_BODY_BYTES = 10 * 1024 * 1024  # API Gateway's payload limit
STAGE = "local"

Handler = Callable[[dict, Any], Mapping[str, Any]]

log = logging.getLogger(__name__)


def resource_for(path: str) -> tuple[str, dict[str, str] | None]:
    """The API Gateway resource a path matches, and its path parameters."""
    matched = router.match_path(path)
    if matched is None:
        return path, None
    resource, connection_id = matched
    return resource, None if connection_id is None else {"connection_id": connection_id}


def build_event(
    method: str,
    target: str,
    headers: Iterable[tuple[str, str]],
    body: bytes,
    *,
    source_ip: str = "127.0.0.1",
    request_id: str | None = None,
    now_ms: int | None = None,
) -> dict[str, Any]:
    """The REST API proxy event for one request (``target`` is path and query)."""
    url = urlsplit(target)
    path = url.path or "/"
    resource, path_parameters = resource_for(path)
    multi_headers: dict[str, list[str]] = {}
    for name, value in headers:
        multi_headers.setdefault(name, []).append(value)
    multi_query: dict[str, list[str]] = {}
    for name, value in parse_qsl(url.query, keep_blank_values=True):
        multi_query.setdefault(name, []).append(value)
    if body:
        try:
            text, is_base64 = body.decode("utf-8"), False
        except UnicodeDecodeError:
            text, is_base64 = base64.b64encode(body).decode("ascii"), True
    else:
        text, is_base64 = None, False
    request_id = request_id or str(uuid.uuid4())
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return {
        "resource": resource,
        "path": path,
        "httpMethod": method,
        # Single-value maps carry the last value, as API Gateway's do.
        "headers": {k: v[-1] for k, v in multi_headers.items()} or None,
        "multiValueHeaders": multi_headers or None,
        "queryStringParameters": {k: v[-1] for k, v in multi_query.items()} or None,
        "multiValueQueryStringParameters": multi_query or None,
        "pathParameters": path_parameters,
        "stageVariables": None,
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "local",
            "stage": STAGE,
            "requestId": request_id,
            "resourcePath": resource,
            "httpMethod": method,
            "path": f"/{STAGE}{path}",
            "protocol": "HTTP/1.1",
            "requestTimeEpoch": now_ms,
            "identity": {"sourceIp": source_ip, "userAgent": multi_headers.get("User-Agent", [None])[-1]},
        },
        "body": text,
        "isBase64Encoded": is_base64,
    }


class LambdaContext:
    """The parts of the Lambda context object a handler may read."""

    function_name = "wsfleet-router-local"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:local:000000000000:function:wsfleet-router-local"

    def __init__(self, aws_request_id: str, timeout_s: float = 29.0) -> None:
        self.aws_request_id = aws_request_id
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


class _BadResponse(ValueError):
    """The handler's result is not a proxy response."""


def http_response(result: Any) -> tuple[int, list[tuple[str, str]], bytes]:
    """(status, headers, body bytes) from a proxy response; :class:`_BadResponse` if malformed."""
    if not isinstance(result, Mapping):
        raise _BadResponse(f"the handler returned {type(result).__name__}, not a dict")
    status = result.get("statusCode")
    if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
        raise _BadResponse(f"statusCode must be an HTTP status, got {status!r}")
    headers: dict[str, list[str]] = {k: [str(v)] for k, v in (result.get("headers") or {}).items()}
    for name, values in (result.get("multiValueHeaders") or {}).items():
        headers[name] = [str(v) for v in values]
    body = result.get("body")
    if body is None:
        raw = b""
    elif not isinstance(body, str):
        raise _BadResponse(f"body must be a string, got {type(body).__name__}")
    elif result.get("isBase64Encoded"):
        raw = base64.b64decode(body)
    else:
        raw = body.encode("utf-8")
    return status, [(k, v) for k, values in headers.items() for v in values], raw


def _make_request_handler(handler: Handler) -> type[BaseHTTPRequestHandler]:
    class ProxyRequestHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, so load tests can reuse connections
        timeout = 60  # an idle keep-alive connection frees its thread after this

        def _proxy(self) -> None:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                self._send_json(411, {"message": "Length Required"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self._send_json(400, {"message": "Bad Content-Length"})
                return
            if length > MAX_BODY_BYTES:
                self.close_connection = True  # the unread body would poison keep-alive
                self._send_json(413, {"message": "Request Too Long"})
                return
            body = self.rfile.read(length) if length > 0 else b""
            event = build_event(self.command, self.path, self.headers.items(), body, source_ip=self.client_address[0])
            context = LambdaContext(event["requestContext"]["requestId"])
            try:
                status, headers, raw = http_response(handler(event, context))
            except Exception:
                log.exception("handler failed or returned a malformed response for %s %s", self.command, self.path)
                self._send_json(502, {"message": "Internal server error"})
                return
            self._send(status, headers, raw)

        def _send_json(self, status: int, body: Mapping[str, Any]) -> None:
            self._send(status, [("Content-Type", "application/json")], json.dumps(body).encode())

        def _send(self, status: int, headers: list[tuple[str, str]], raw: bytes) -> None:
            self.send_response(status)
            for name, value in headers:
                if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(raw)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _proxy

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the handler logs each request itself."""

    return ProxyRequestHandler


class LocalApi:
    """The HTTP server, serving from a background thread."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = ThreadingHTTPServer((host, port), _make_request_handler(handler))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "LocalApi":
        # A short poll makes stop() quick; an idle poll costs next to nothing.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="local-api", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting requests; requests in flight finish on their own threads."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> "LocalApi":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.api", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    route_stdlib_logging(component="local-api")

    try:
        app = router.Router.from_env()
    except ConfigError as error:
        JsonLogger(sys.stderr, component="local-api").error("config_error", message=str(error))
        return 2
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    api = LocalApi(app.handle, args.host, args.port).start()
    print(f"READY {api.url}", flush=True)
    stop.wait()
    api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
