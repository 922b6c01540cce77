"""The event router: API Gateway (REST, proxy integration) in, desired state out.

``POST /events`` records START / STOP in the connections table. A START that leaves the
connection STARTED with no owner drops a hint on the queue so that a worker picks it up
at once. The hint is only an accelerator: if SendMessage fails the request still
succeeds, because the workers' orphan reconciler finds every STARTED connection
without an owner anyway. A STOP of an owned connection is posted to the owning session's
inbox in the same write (see :meth:`ConnectionsStore.stop`), so that no lost answer and
no crash of this function can keep it from the owner. ``GET /connections/{connection_id}``
returns the public state, ``DELETE`` removes a STOPPED one that no session holds any more
(its messages go by TTL); ``GET /connections/{connection_id}/messages`` a page of what is
stored (:mod:`wsfleet.message_pages`), large data as presigned S3 URLs: presigning is
computed here from the function's own credentials, no S3 request. Where ``SINK`` has no
dynamodb the frames are on a Kinesis stream only, and the read API answers 409
``messages_not_stored`` without reading anything.

A START's optional ``upstream`` object is validated by :func:`wsfleet.upstream_spec.parse`
and stored in its stored form (secret ARNs, never values); a different one on a STARTED
connection is a 409, as a different ws_url is.

Every request is validated completely before the first write, so a 4xx never writes.
Store writes are conditional (see :mod:`wsfleet.store`), so concurrent requests for
one connection need no coordination here.

``handler`` is the Lambda entry point; :class:`Router` is the same thing with its
configuration and clients passed in, for tests and other hosts.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import traceback
from typing import Any, Callable, Mapping
from urllib.parse import unquote

import boto3
from botocore.config import Config

from . import credentials, message_pages, schema, tracing, upstream_spec
from .config import RouterConfig
from .settings_spec import ConfigError
from .start_assign import tell_workers
from .leases import released_at_fence
from .logs import JsonLogger, route_stdlib_logging
from .sinks import MessagesStore
from .store import ConnectionsStore, DeleteOutcome, SessionsStore, StartOutcome, StopOutcome, TransientError
from .validation import Allowlist, Invalid, check_connection_id, check_ws_url

MAX_BODY_BYTES = 16 * 1024
SERVICE_NAME = "wsfleet-router"

EVENTS = "/events"
CONNECTION = "/connections/{connection_id}"
MESSAGES = "/connections/{connection_id}/messages"
ROUTES: Mapping[str, tuple[str, ...]] = {EVENTS: ("POST",), CONNECTION: ("GET", "DELETE"), MESSAGES: ("GET",)}
_CONNECTION_PREFIX = "/connections/"
_MESSAGES_SUFFIX = "/messages"

# Standard retries ride out throttling and 5xx before we answer 503. DynamoDB and SQS
# answer in milliseconds; the short timeouts keep three attempts and their backoff
# inside the function's 10 s timeout, so the caller gets our 503, not a gateway 502.
CLIENT_CONFIG = Config(retries={"mode": "standard", "total_max_attempts": 3}, connect_timeout=1, read_timeout=2)

_START_STATUS = {
    StartOutcome.CREATED: 202,
    StartOutcome.RESTARTED: 202,
    StartOutcome.UNCHANGED: 200,
}
_STOP_STATUS = {StopOutcome.STOPPED: 202, StopOutcome.ALREADY_STOPPED: 200}


class HttpError(Exception):
    """A request the router answers with an error body; 4xx ones have written nothing."""

    def __init__(self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


def response(status: int, body: Mapping[str, Any] | str, headers: Mapping[str, str] | None = None) -> dict:
    """The proxy response; ``body`` an object, or JSON text already (a messages page)."""
    return {
        "statusCode": status,
        "headers": {"Content-Type": "application/json", **(headers or {})},
        "body": body if isinstance(body, str) else json.dumps(body, separators=(",", ":")),
        "isBase64Encoded": False,
    }


def error_response(status: int, code: str, message: str, headers: Mapping[str, str] | None = None) -> dict:
    return response(status, {"error": code, "message": message}, headers)


def make_client(service: str, config: RouterConfig) -> Any:
    """A boto3 client for the router; its own session, because the default one is not
    safe to create clients from in several threads."""
    return boto3.session.Session().client(
        service, region_name=config.region, endpoint_url=config.endpoint_url, config=CLIENT_CONFIG
    )


def make_presigner(config: RouterConfig, session: Any = None) -> Any:
    """The S3 client that presigns data URLs (it never sends a request). SigV4 on the
    bucket's regional host: botocore would otherwise presign for the global
    ``s3.amazonaws.com``, which redirects outside us-east-1 and breaks the signature
    (boto/boto3#2728). An endpoint override (the emulator) is addressed path-style.
    ``session``: the boto3 session whose credentials sign [a new default one]."""
    if config.endpoint_url:
        endpoint, style = config.endpoint_url, "path"
    else:
        suffix = "amazonaws.com.cn" if config.region.startswith("cn-") else "amazonaws.com"
        endpoint, style = f"https://s3.{config.region}.{suffix}", "virtual"
    return (session or boto3.session.Session()).client(
        "s3",
        region_name=config.region,
        endpoint_url=endpoint,
        config=CLIENT_CONFIG.merge(Config(signature_version="s3v4", s3={"addressing_style": style})),
    )


class Router:
    def __init__(
        self,
        config: RouterConfig,
        ddb: Any,
        sqs: Any,
        *,
        s3: Any = None,
        logger: JsonLogger | None = None,
    ) -> None:
        """``s3``: the client that presigns data URLs [one built from ``config``]."""
        self._config = config
        self._store = ConnectionsStore(
            ddb, config.table_name, state_shards=config.state_shards, sessions_table_name=config.sessions_table_name
        )
        self._sessions = SessionsStore(ddb, config.sessions_table_name)
        self._messages = MessagesStore(ddb, config.messages_table_name)
        self._sqs = sqs
        self._s3 = s3 if s3 is not None else make_presigner(config)
        self._allowlist = Allowlist.of(config.allowed_ws_hosts)
        self._log = logger or JsonLogger(component="router")
        # Frames are in the messages table only where SINK has dynamodb.
        self._reads_table = schema.SINK_DYNAMODB in config.sinks

    @property
    def config(self) -> RouterConfig:
        return self._config

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        ddb: Any = None,
        sqs: Any = None,
        s3: Any = None,
        logger: JsonLogger | None = None,
    ) -> "Router":
        """Configuration from the environment; clients given here win over building them."""
        config = RouterConfig.from_env(env)
        return cls(
            config,
            ddb if ddb is not None else make_client("dynamodb", config),
            sqs if sqs is not None else make_client("sqs", config),
            s3=s3,
            logger=logger,
        )

    def handle(self, event: Mapping[str, Any], context: Any = None) -> dict:
        """One API Gateway proxy event in, one proxy response out. Never raises."""
        started = time.monotonic()
        if not isinstance(event, Mapping):  # a direct invocation with junk: no route
            event = {}
        fields: dict[str, Any] = {
            "method": event.get("httpMethod"),
            "path": event.get("path"),
            "request_id": getattr(context, "aws_request_id", None),
            "api_request_id": (event.get("requestContext") or {}).get("requestId"),
        }
        with tracing.invocation("router", method=fields["method"]) as span:
            try:
                status, body = self._dispatch(event, fields)
                result = response(status, body)
            except HttpError as exc:
                status, fields["outcome"] = exc.status, exc.code
                result = error_response(exc.status, exc.code, exc.message, exc.headers)
            except TransientError as exc:
                status, fields["outcome"] = 503, "service_unavailable"
                fields["detail"] = str(exc)
                result = error_response(
                    503,
                    "service_unavailable",
                    "DynamoDB is busy or unavailable; retry the request with backoff.",
                    {"Retry-After": "1"},
                )
            except Exception as exc:  # the contract: a JSON 500, never a traceback to the caller
                status, fields["outcome"] = 500, "internal_error"
                fields["detail"] = f"{type(exc).__name__}: {exc}"
                fields["traceback"] = traceback.format_exc()
                result = error_response(500, "internal_error", "The event router failed unexpectedly; the error has been logged.")
            span.annotate(
                event_type=fields.get("event_type"),
                connection_id=fields.get("connection_id"),
                outcome=fields.get("outcome"),
                status=status,
            )
        fields["status"] = status
        fields["duration_ms"] = round((time.monotonic() - started) * 1000, 1)
        if status >= 500:
            self._log.error("request", **fields)
        else:
            self._log.info("request", **fields)
        return result

    # --- routing -------------------------------------------------------------------

    def _dispatch(self, event: Mapping[str, Any], fields: dict[str, Any]) -> tuple[int, dict | str]:
        route, path_id = _route(event)
        fields["route"] = route
        allowed = ROUTES[route]
        method = str(event.get("httpMethod") or "").upper()
        if method not in allowed:
            raise HttpError(
                405,
                "method_not_allowed",
                f"{method or 'This method'} is not allowed on {route}; use {', '.join(allowed)}.",
                {"Allow": ", ".join(allowed)},
            )
        if route == EVENTS:
            return self._post_event(_json_body(event), fields)
        if route == MESSAGES:
            return self._get_messages(path_id, event, fields)
        if method == "DELETE":
            return self._delete(path_id, fields)
        return self._get_connection(path_id, fields)

    def _post_event(self, body: dict, fields: dict[str, Any]) -> tuple[int, dict]:
        event_type = _field(body, "event_type")
        fields["event_type"] = event_type if isinstance(event_type, str) else None
        if event_type not in ("START", "STOP"):
            raise HttpError(400, "unknown_event_type", "event_type must be \"START\" or \"STOP\".")
        connection_id = _valid(check_connection_id, _field(body, "connection_id"))
        fields["connection_id"] = connection_id
        if event_type == "START":
            ws_url = _valid(check_ws_url, _field(body, "ws_url"), self._allowlist)
            upstream = _valid_upstream(body.get("upstream"), self._config)
            _valid(credentials.check_start, ws_url, upstream)  # cleartext_secret, secret_in_plain
            return self._start(connection_id, ws_url, upstream, fields)
        return self._stop(connection_id, fields)

    # --- the four operations -------------------------------------------------------

    def _start(
        self, connection_id: str, ws_url: str, upstream: upstream_spec.Upstream, fields: dict[str, Any]
    ) -> tuple[int, dict]:
        started = self._store.start(connection_id, ws_url, upstream.item())
        outcome = started.outcome
        fields["outcome"] = outcome.value
        if outcome is StartOutcome.CONFLICT:
            differs = " and ".join(started.differs) or "settings"
            raise HttpError(
                409,
                "conflict",
                f"Connection {connection_id} is already STARTED with a different {differs}; "
                "STOP it, then START it again to apply the new one.",
            )
        if started.unowned:
            # Also on UNCHANGED: a retry whose first write landed with its answer lost
            # reads UNCHANGED, and the connection still waits for its first owner. One
            # still attached to an owner (restarted before its STOP's release) is hinted
            # by that owner when it releases it.
            fields.update(tell_workers(self._sqs, self._config.queue_url, self._store, self._sessions, connection_id,
                                       started.fence_token, self._log))
        body = {"connection_id": connection_id, "desired_state": schema.STARTED, "outcome": outcome.value}
        return _START_STATUS[outcome], body

    def _stop(self, connection_id: str, fields: dict[str, Any]) -> tuple[int, dict]:
        stopped = self._store.stop(connection_id, sessions=self._sessions)
        outcome = stopped.outcome
        fields["outcome"] = outcome.value
        if outcome is StopOutcome.NOT_FOUND:
            raise _unknown_connection(connection_id)
        if stopped.lease_session:
            fields["owner_told"] = stopped.told
        body = {"connection_id": connection_id, "desired_state": schema.STOPPED, "outcome": outcome.value}
        return _STOP_STATUS[outcome], body

    def _delete(self, raw_id: object, fields: dict[str, Any]) -> tuple[int, dict]:
        """A STOPPED connection its owner has let go: its item goes (its messages by TTL)."""
        connection_id = _valid(check_connection_id, raw_id)
        fields["connection_id"] = connection_id
        outcome = self._store.delete(connection_id)
        fields["outcome"] = outcome.value
        if outcome is DeleteOutcome.NOT_FOUND:
            raise _unknown_connection(connection_id)
        if outcome is not DeleteOutcome.DELETED:
            held = outcome is DeleteOutcome.HELD
            why = "its owner has not released it yet; try again in a few seconds" if held else "it is STARTED; STOP it first"
            raise HttpError(409, "not_deletable", f"Connection {connection_id} cannot be deleted: {why}.")
        return 200, {"connection_id": connection_id, "outcome": outcome.value}

    def _get_connection(self, raw_id: object, fields: dict[str, Any]) -> tuple[int, dict]:
        connection_id = _valid(check_connection_id, raw_id)
        fields["connection_id"] = connection_id
        item = self._store.get(connection_id)
        if item is None:
            raise _unknown_connection(connection_id)
        fields["outcome"] = "found"
        session_id = item.get(schema.LEASE_SESSION, "")
        if released_at_fence(item):
            # Handed off by its session to a peer that has not taken it yet: nobody holds it.
            session_id = item[schema.LEASE_OWNER] = ""
        session = self._sessions.get(session_id, consistent=False) if session_id else None
        item[schema.LEASE_EXPIRES_AT_MS] = int((session or {}).get(schema.EXPIRES_AT_MS, 0))
        # Markers are counted in the messages table; where it is no sink there is no count.
        item[schema.SKIPPED_COUNT] = self._messages.count_markers(connection_id) if self._reads_table else None
        # The stored form: ARNs, never a secret's value (none is ever stored); {} for the default.
        item[schema.UPSTREAM] = item.get(schema.UPSTREAM) or {}
        # Frames, bytes and the newest frame's time as the last checkpoint counted them; 0 before the first.
        item.update({name: int(item.get(name, 0)) for name in schema.COUNTS})
        public = {"connection_id": connection_id, **{name: item.get(name) for name in schema.PUBLIC_FIELDS}}
        quarantined = item.get(schema.QUARANTINED)
        if isinstance(quarantined, dict):  # absent unless the crash-loop breaker set it aside
            public[schema.QUARANTINED] = {"reason": str(quarantined.get("reason", "")), "at_ms": int(quarantined.get("at_ms", 0))}
        return 200, public

    def _get_messages(self, raw_id: object, event: Mapping[str, Any], fields: dict[str, Any]) -> tuple[int, str]:
        """A page of the connection's stored messages after ``after_seq``; reads only."""
        connection_id = _valid(check_connection_id, raw_id)
        fields["connection_id"] = connection_id
        try:
            page = message_pages.page_request(
                event.get("queryStringParameters"), event.get("multiValueQueryStringParameters")
            )
        except Invalid as exc:
            raise HttpError(400, exc.code, exc.message) from None
        if not self._reads_table:
            raise _messages_not_stored(self._config)
        if self._store.get(connection_id) is None:
            raise _unknown_connection(connection_id)
        items = self._messages.read_after(connection_id, page.after_seq, batch=page.limit + 1)
        body, count = message_pages.page_text(items, limit=page.limit, presign=self._presign, now_s=time.time())
        fields["outcome"] = "found"
        fields["messages"] = count
        return 200, body

    def _presign(self, bucket: str, key: str) -> str:
        return self._s3.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=message_pages.DATA_URL_SECONDS
        )


# --- request parsing (pure) -------------------------------------------------------------


def match_path(path: str) -> tuple[str, str | None] | None:
    """The route template a raw path matches, as API Gateway's resources do, and its
    raw (not percent-decoded) connection_id or None; None when no route matches."""
    if path == EVENTS:
        return EVENTS, None
    tail = path[len(_CONNECTION_PREFIX):] if path.startswith(_CONNECTION_PREFIX) else ""
    if tail and "/" not in tail:
        return CONNECTION, tail
    listed = tail[: -len(_MESSAGES_SUFFIX)] if tail.endswith(_MESSAGES_SUFFIX) else ""
    if listed and "/" not in listed:
        return MESSAGES, listed
    return None


def _route(event: Mapping[str, Any]) -> tuple[str, object]:
    """(route template, raw connection_id or None). The resource template decides when
    API Gateway gives one of ours; otherwise (a greedy proxy resource) the path does."""
    resource = event.get("resource")
    if resource in ROUTES:
        params = event.get("pathParameters") or {}
        raw = params.get("connection_id") if resource in (CONNECTION, MESSAGES) else None
    else:
        path = str(event.get("path") or "")
        matched = match_path(path)
        if matched is None:
            raise HttpError(
                404,
                "not_found",
                f"No route for {path or 'this path'}; use POST /events, GET or DELETE "
                "/connections/{connection_id}, or GET /connections/{connection_id}/messages.",
            )
        resource, raw = matched
    # A client may percent-encode ':' in the path. '%' is not allowed in an id, so
    # decoding cannot turn one valid id into another.
    if isinstance(raw, str) and "%" in raw:
        raw = unquote(raw)
    return resource, raw


def _json_body(event: Mapping[str, Any]) -> dict:
    body = event.get("body")
    if not isinstance(body, str) or not body:
        raise HttpError(400, "invalid_json", "The request body must be a JSON object.")
    if event.get("isBase64Encoded"):
        try:
            raw = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            raise HttpError(400, "invalid_body", "The request body is marked base64 but is not valid base64.") from None
    else:
        raw = body.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_BODY_BYTES:
        raise HttpError(400, "body_too_large", f"The request body must be at most {MAX_BODY_BYTES} bytes; it was {len(raw)}.")
    try:
        parsed = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise HttpError(400, "invalid_json", "The request body is not valid UTF-8 JSON.") from None
    if not isinstance(parsed, dict):
        raise HttpError(400, "invalid_json", "The request body must be a JSON object.")
    return parsed


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _field(body: Mapping[str, Any], name: str) -> Any:
    value = body.get(name)
    if value is None:
        raise HttpError(400, "missing_field", f"The request body must include \"{name}\".")
    return value


def _valid(check: Callable[..., str], *args: Any) -> str:
    try:
        return check(*args)
    except Invalid as exc:
        raise HttpError(400, exc.code, exc.message) from None


def _valid_upstream(value: object, config: RouterConfig) -> upstream_spec.Upstream:
    """The START's ``upstream`` (absent or null: the default protocol), or a 400."""
    try:
        return upstream_spec.parse(value, secret_prefix=config.upstream_secret_prefix, region=config.region)
    except Invalid as exc:
        raise HttpError(400, exc.code, exc.message) from None


def _messages_not_stored(config: RouterConfig) -> HttpError:
    """The read API where the workers store no frame in the table (SINK without dynamodb):
    a 409 that says where the frames went, before anything is read."""
    kinesis = f"the Kinesis stream {config.messages_stream_name}" if config.messages_stream_name else "a Kinesis stream"
    firehose = "a Firehose delivery stream (S3, for Athena)"
    where = " and ".join(p for s, p in ((schema.SINK_KINESIS, kinesis), (schema.SINK_FIREHOSE, firehose)) if s in config.sinks)
    return HttpError(409, "messages_not_stored", f"This fleet sends frames to {where or 'a stream'}, not to the messages "
                     "table: the read API needs SINK to include dynamodb (SINK=dynamodb,kinesis stores both). Read the "
                     "stream, the reference consumer's objects, or the delivery stream's table with Athena.")


def _unknown_connection(connection_id: str) -> HttpError:
    return HttpError(404, "connection_not_found", f"No connection {connection_id} is known; START it first.")


# --- Lambda entry point ------------------------------------------------------------------

_router: Router | None = None
_log = JsonLogger(component="router")


def handler(event: Mapping[str, Any], context: Any) -> dict:
    """Lambda entry point. The router (logging, configuration, clients, tracing) is built
    on the first call of each execution environment and kept; a bad configuration is answered
    with a 500 naming the variable, and retried on the next call."""
    global _router
    if _router is None:  # Lambda runs one invocation at a time per environment
        try:
            route_stdlib_logging(component="router")
            router = Router.from_env(logger=_log)
            tracing.configure(router.config.tracing, SERVICE_NAME)
            _router = router
        except ConfigError as exc:
            _log.error("config_invalid", detail=str(exc))
            return error_response(500, "misconfigured", f"The event router is misconfigured: {exc}.")
        except Exception as exc:  # same promise as Router.handle: JSON, not a traceback
            _log.error("startup_failed", detail=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
            return error_response(500, "internal_error", "The event router failed to start; the error has been logged.")
    return _router.handle(event, context)
