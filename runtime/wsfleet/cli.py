"""The operators' CLI, ``wsfleet``: START, STOP and GET through the API, and the fleet
as the tables record it (workers, ownership, checkpoints, stored messages).

Two ways in, as the fleet has them. ``start``, ``stop`` and ``get`` go through the API
like any caller: signed with SigV4 from the default credential chain, except a local
API on loopback, which has no authorizer. ``status``, ``connections`` and ``messages``
only read the tables, with the same environment variables the worker takes (or a
stack's outputs); they never write.

Every read goes through the store where it has one; the few it lacks (Scans, a
BatchGetItem of connections, a page of messages) are in :class:`FleetReader`.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Mapping, Sequence

import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

from . import config, schema
from .store import ConnectionsStore, SessionsStore, TransientError, marshal, now_ms, unmarshal

PROG = "wsfleet"
API_SERVICE = "execute-api"
HTTP_TIMEOUT_S = 30
BATCH_GET_MAX = 100  # BatchGetItem's limit

# What the stacks publish (stacks/): the RestApi's own endpoint output of the service
# stack (construct "Api"), and the table names the stateful stack hands the service
# stack (CDK names those outputs after the tables' fixed logical ids, whichever
# reference style it uses). tests/stacks/test_cli_outputs.py keeps them in step.
API_OUTPUT = re.compile(r"ApiEndpoint[0-9A-F]{8}")
TABLE_OUTPUT = re.compile(
    r"(?:PublishOutput|ExportsOutput)Ref(ConnectionsTable|SessionsTable|MessagesTable)[0-9A-F]{8}"
)
_REGION_IN_HOST = re.compile(r"\.execute-api\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?")


class CliError(Exception):
    """Something the operator has to hear about, as one sentence."""


# --- the API -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiReply:
    status: int
    body: dict  # the JSON body; {"message": <text>} when the API did not answer JSON

    @property
    def ok(self) -> bool:
        return self.status < 400

    def sentence(self) -> str:
        message = self.body.get("message") or self.body.get("error") or "no message"
        return f"{str(message).rstrip('.')} (HTTP {self.status})"


def is_local(url: str) -> bool:
    """A loopback API is the local stand-in (``wsfleet.local.api``): nothing to sign."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def region_in_url(url: str) -> str | None:
    """The region of an ``execute-api`` host name, if the URL is one."""
    match = _REGION_IN_HOST.search(urllib.parse.urlsplit(url).hostname or "")
    return match.group(1) if match else None


def _urlopen(request: urllib.request.Request, *, direct: bool) -> tuple[int, bytes]:
    # A loopback API is reached directly, whatever proxy the environment names.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({})) if direct else urllib.request.build_opener()
    try:
        with opener.open(request, timeout=HTTP_TIMEOUT_S) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise CliError(f"cannot reach the API at {request.full_url}: {reason}") from None


class ApiClient:
    """The router's routes over HTTP: signed with SigV4 for ``execute-api`` unless the
    API is on loopback. ``send`` is how a request leaves (tests capture it)."""

    def __init__(
        self,
        base_url: str,
        *,
        credentials: Any = None,
        region: str | None = None,
        send: Callable[[urllib.request.Request], tuple[int, bytes]] | None = None,
    ) -> None:
        if urllib.parse.urlsplit(base_url).scheme not in ("http", "https"):
            raise CliError(f"the API URL must be http(s)://..., got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        local = is_local(base_url)
        self._signer = None
        if not local:
            if credentials is None:
                raise CliError("no AWS credentials to sign the request: configure a profile or set AWS_ACCESS_KEY_ID")
            if not region:
                raise CliError(f"cannot tell the region of {base_url} from its host name: pass --region")
            self._signer = SigV4Auth(credentials, API_SERVICE, region)
        self._send = send or (lambda request: _urlopen(request, direct=local))

    def start(self, connection_id: str, ws_url: str) -> ApiReply:
        return self.request(
            "POST", "/events", {"event_type": "START", "connection_id": connection_id, "ws_url": ws_url}
        )

    def stop(self, connection_id: str) -> ApiReply:
        return self.request("POST", "/events", {"event_type": "STOP", "connection_id": connection_id})

    def get(self, connection_id: str) -> ApiReply:
        # Ids are A-Za-z0-9._:- ; anything else is encoded, and the router answers 400.
        return self.request("GET", "/connections/" + urllib.parse.quote(connection_id, safe=":"))

    def request(self, method: str, path: str, payload: Mapping[str, Any] | None = None) -> ApiReply:
        url = self.base_url + path
        body = b"" if payload is None else json.dumps(payload).encode()
        headers = {"Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        if self._signer is not None:
            headers = self.signed_headers(method, url, body, headers)
        request = urllib.request.Request(url, data=body or None, headers=headers, method=method)
        status, raw = self._send(request)
        return ApiReply(status, _json_object(raw))

    def signed_headers(self, method: str, url: str, body: bytes, headers: Mapping[str, str]) -> dict[str, str]:
        """``headers`` plus Host, X-Amz-Date, X-Amz-Security-Token (temporary
        credentials) and Authorization, by botocore's signer. Every header sent is
        signed, Host included, so nothing on the way can change one unnoticed."""
        request = AWSRequest(
            method=method, url=url, data=body, headers={"Host": urllib.parse.urlsplit(url).netloc, **headers}
        )
        assert self._signer is not None
        self._signer.add_auth(request)
        return dict(request.headers.items())


def _json_object(raw: bytes) -> dict:
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    text = raw.decode("utf-8", "replace").strip()
    return {"message": text[:300] or "empty response"}


# --- where things are: environment or stack outputs ------------------------------------------


def _session(args: argparse.Namespace, env: Mapping[str, str]) -> boto3.session.Session:
    region = args.region or env.get(config.AWS_REGION) or env.get(config.AWS_DEFAULT_REGION) or None
    return boto3.session.Session(region_name=region)


def _client(session: boto3.session.Session, service: str, env: Mapping[str, str]) -> Any:
    return session.client(service, endpoint_url=env.get(config.AWS_ENDPOINT_URL) or None)


def stack_outputs(cfn: Any, stack_name: str) -> dict[str, str]:
    try:
        (stack,) = cfn.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as error:
        if "does not exist" in error.response.get("Error", {}).get("Message", ""):
            raise CliError(f"stack {stack_name} does not exist in {cfn.meta.region_name}") from None
        raise
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def api_url_of(outputs: Mapping[str, str], stack_name: str) -> str:
    urls = [value for key, value in outputs.items() if API_OUTPUT.fullmatch(key)]
    if len(urls) != 1:
        raise CliError(f"stack {stack_name} has no API endpoint output: name the service stack (wsfleet-<env>-service)")
    return urls[0]


@dataclass(frozen=True)
class Tables:
    connections: str
    sessions: str
    messages: str
    state_shards: int  # FREE#<shard> partitions of by_owner to read (the stack's STATE_SHARDS)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Tables":
        return cls(
            connections=env.get(config.TABLE_NAME, "").strip(),
            sessions=env.get(config.SESSIONS_TABLE_NAME, "").strip(),
            messages=env.get(config.MESSAGES_TABLE_NAME, "").strip(),
            state_shards=config.state_shards(env),
        )

    @classmethod
    def from_outputs(cls, outputs: Mapping[str, str], stack_name: str, env: Mapping[str, str]) -> "Tables":
        names = {}
        for key, value in outputs.items():
            match = TABLE_OUTPUT.fullmatch(key)
            if match:
                names[match.group(1)] = value
        if not names:
            raise CliError(f"stack {stack_name} has no table outputs: name the stateful stack (wsfleet-<env>-stateful)")
        return cls(
            connections=names.get("ConnectionsTable", ""),
            sessions=names.get("SessionsTable", ""),
            messages=names.get("MessagesTable", ""),
            state_shards=config.state_shards(env),
        )

    def need(self, *which: str) -> None:
        variables = {
            "connections": config.TABLE_NAME,
            "sessions": config.SESSIONS_TABLE_NAME,
            "messages": config.MESSAGES_TABLE_NAME,
        }
        missing = [variables[w] for w in which if not getattr(self, w)]
        if missing:
            raise CliError(f"{', '.join(missing)} not set: export the fleet's environment or pass --stack")


# --- reading the tables ------------------------------------------------------------------------


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
    oldest_owned: dict | None  # the owned STARTED item updated longest ago
    free_shards: frozenset[int]  # FREE#<shard> partitions seen


class FleetReader:
    """The CLI's reads. The sessions table is small (one item per worker run, ended
    ones kept a week), so it is scanned whole; connections are read through the
    ``by_owner`` index, except for counts by state, which need a Scan."""

    def __init__(self, ddb: Any, tables: Tables) -> None:
        self._ddb = ddb
        self.tables = tables
        self.connections = ConnectionsStore(ddb, tables.connections, state_shards=tables.state_shards)
        self.sessions_store = SessionsStore(ddb, tables.sessions)

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
        names = {
            "#s": schema.DESIRED_STATE,
            "#u": schema.UPDATED_AT_MS,
            "#l": schema.LEASE_SESSION,
            "#k": schema.OWNER_KEY,
            "#p": schema.PK,
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
                owned = state == schema.STARTED and item.get(schema.LEASE_SESSION) in live
                if owned and (
                    oldest is None or item.get(schema.UPDATED_AT_MS, 0) < oldest.get(schema.UPDATED_AT_MS, 0)
                ):
                    oldest = item
        return ScanSummary(by_state, oldest, frozenset(free_shards))

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

    def messages(self, connection_id: str, *, from_seq: int, limit: int) -> list[dict]:
        """Stored messages of a connection, in seq order from ``from_seq``."""
        out: list[dict] = []
        pages = self._pages(
            "query",
            TableName=self.tables.messages,
            KeyConditionExpression="#p = :p AND #s >= :from",
            ExpressionAttributeNames={"#p": schema.MSG_PK, "#s": schema.MSG_SK},
            ExpressionAttributeValues=marshal({":p": schema.connection_pk(connection_id), ":from": from_seq}),
            Limit=limit,
        )
        for page in pages:
            out.extend(map(unmarshal, page.get("Items", [])))
            if len(out) >= limit:
                break
        return out[:limit]


# --- the fleet at a glance ---------------------------------------------------------------------


def _age_s(now: int, then_ms: int) -> float:
    return round((now - then_ms) / 1000, 1)


def read_status(reader: FleetReader, now: int) -> dict:
    sessions = reader.sessions()
    live = {sid for sid, s in sessions.items() if s.live_at(now)}
    summary = reader.summary(live)

    # STARTED and unowned: the FREE# partitions (every one up to STATE_SHARDS, and any
    # the Scan saw beyond it), and whatever is attached to a session that is not live.
    free = [
        (cid, schema.free_partition(shard), None)
        for shard in range(max(reader.tables.state_shards, max(summary.free_shards, default=-1) + 1))
        for cid in reader.connections.free(shard)
    ]
    dead = [s for s in sessions.values() if s.holds_orphans_at(now)]
    attached = [
        (owned.connection_id, schema.owner_key_session(s.session_id), s)
        for s in dead
        for owned in reader.connections.owned_by(s.session_id)
        if owned.desired_state == schema.STARTED
    ]
    items = reader.items([cid for cid, _, _ in free + attached])
    unowned = []
    for cid, partition, session in free + attached:
        item = items.get(cid)
        # The index lags the table: keep only what the item itself still says.
        if item is None or item.get(schema.DESIRED_STATE) != schema.STARTED:
            continue
        if item.get(schema.LEASE_SESSION, "") != (session.session_id if session else ""):
            continue
        since = session.expires_at_ms if session else int(item.get(schema.UPDATED_AT_MS, 0))
        unowned.append(
            {
                "connection_id": cid,
                "partition": partition,
                "worker_id": session.worker_id if session else "",
                "session_state": session.describe(now) if session else "",
                "unowned_for_s": _age_s(now, since),
            }
        )

    oldest = summary.oldest_owned
    return {
        "now_ms": now,
        "workers": [
            {
                "worker_id": s.worker_id,
                "session_id": s.session_id,
                "session_age_s": _age_s(now, s.started_at_ms),
                "active": s.active,
                "max_connections": s.max_connections,
                "heartbeat_age_s": _age_s(now, s.heartbeat_at_ms),
                "expires_in_s": -_age_s(now, s.expires_at_ms),
            }
            for s in sorted((sessions[sid] for sid in live), key=lambda s: (s.worker_id, s.session_id))
        ],
        "sessions_not_live_holding": [
            {
                "worker_id": s.worker_id,
                "session_id": s.session_id,
                "state": s.describe(now),
                "expired_s_ago": _age_s(now, s.expires_at_ms),
                "ended_by": s.ended_by,
            }
            for s in sorted(dead, key=lambda s: s.expires_at_ms)
        ],
        "connections": {
            schema.STARTED: summary.by_state.get(schema.STARTED, 0),
            schema.STOPPED: summary.by_state.get(schema.STOPPED, 0),
            "total": sum(summary.by_state.values()),
        },
        "unowned": sorted(unowned, key=lambda u: -u["unowned_for_s"]),
        "oldest_checkpoint": None
        if oldest is None
        else {
            "connection_id": schema.connection_id_from_pk(oldest[schema.PK]),
            "updated_at_ms": int(oldest.get(schema.UPDATED_AT_MS, 0)),
            "age_s": _age_s(now, int(oldest.get(schema.UPDATED_AT_MS, 0))),
        },
    }


# --- rendering -------------------------------------------------------------------------------------


def duration(seconds: float) -> str:
    s = abs(seconds)
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(map(str, headers))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def render_status(status: dict) -> str:
    lines = []
    workers = status["workers"]
    lines.append(f"workers: {len(workers)} live session{'s' if len(workers) != 1 else ''}")
    if workers:
        rows = [
            (
                w["worker_id"],
                duration(w["session_age_s"]),
                f"{w['active']}/{w['max_connections']}",
                duration(w["heartbeat_age_s"]) + " ago",
                duration(w["expires_in_s"]),
            )
            for w in workers
        ]
        lines.append(_indent(table(("WORKER", "SESSION AGE", "ACTIVE/MAX", "HEARTBEAT", "EXPIRES IN"), rows)))
    dead = status["sessions_not_live_holding"]
    if dead:
        lines.append(f"sessions not live that may still hold connections: {len(dead)}")
        rows = [(d["worker_id"], d["state"], duration(d["expired_s_ago"]) + " ago", d["ended_by"] or "-") for d in dead]
        lines.append(_indent(table(("WORKER", "STATE", "EXPIRED", "ENDED BY"), rows)))
    counts = status["connections"]
    lines.append(f"connections: {counts['STARTED']} STARTED, {counts['STOPPED']} STOPPED ({counts['total']} in all)")
    unowned = status["unowned"]
    lines.append(f"STARTED but unowned: {len(unowned)}")
    if unowned:
        rows = [
            (
                u["connection_id"],
                u["partition"] if not u["worker_id"] else f"{u['worker_id']} ({u['session_state']})",
                duration(u["unowned_for_s"]),
            )
            for u in unowned
        ]
        lines.append(_indent(table(("CONNECTION", "WHERE", "FOR"), rows)))
    oldest = status["oldest_checkpoint"]
    if oldest:
        lines.append(
            f"oldest checkpoint of an owned connection: {oldest['connection_id']}, {duration(oldest['age_s'])} ago"
        )
    else:
        lines.append("oldest checkpoint of an owned connection: none owned")
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _owner(item: Mapping[str, Any], sessions: Mapping[str, Session], now: int) -> tuple[str, bool]:
    """(who holds it, as shown; whether that session owns it now)."""
    session_id = item.get(schema.LEASE_SESSION, "")
    if not session_id:
        return "-", False
    session = sessions.get(session_id)
    worker = item.get(schema.LEASE_OWNER, "") or (session.worker_id if session else "?")
    if session is not None and session.live_at(now):
        return worker, True
    return f"{worker} ({session.describe(now) if session else 'session gone'})", False


def connection_rows(items: Sequence[dict], sessions: Mapping[str, Session], now: int) -> list[dict]:
    rows = []
    for item in sorted(items, key=lambda i: i[schema.PK]):
        owner, owned = _owner(item, sessions, now)
        rows.append(
            {
                "connection_id": schema.connection_id_from_pk(item[schema.PK]),
                "desired_state": item.get(schema.DESIRED_STATE, ""),
                "ws_url": item.get(schema.WS_URL, ""),
                "lease_owner": item.get(schema.LEASE_OWNER, ""),
                "lease_session": item.get(schema.LEASE_SESSION, ""),
                "owned": owned,
                "owner": owner,
                "fence_token": int(item.get(schema.FENCE_TOKEN, 0)),
                "last_seq": int(item.get(schema.LAST_SEQ, 0)),
                "updated_at_ms": int(item.get(schema.UPDATED_AT_MS, 0)),
            }
        )
    return rows


def _when(ms: int, now: int) -> str:
    """An epoch-ms time as an operator reads it: "in 8.2s" or "3.1s ago"."""
    return f"in {duration((ms - now) / 1000)}" if ms > now else f"{duration((now - ms) / 1000)} ago"


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


# --- commands ----------------------------------------------------------------------------------------


def _emit(args: argparse.Namespace, value: Any, human: str) -> None:
    print(json.dumps(value, indent=2) if args.json else human)


def _api(args: argparse.Namespace, env: Mapping[str, str]) -> ApiClient:
    session = _session(args, env)
    url = args.api or api_url_of(stack_outputs(_client(session, "cloudformation", env), args.stack), args.stack)
    if is_local(url):
        return ApiClient(url)
    return ApiClient(url, credentials=session.get_credentials(), region=region_in_url(url) or session.region_name)


def _reply(args: argparse.Namespace, reply: ApiReply, human: str) -> int:
    if not reply.ok:
        if args.json:
            print(json.dumps({"status": reply.status, "body": reply.body}, indent=2))
        raise CliError(reply.sentence())
    _emit(args, {"status": reply.status, "body": reply.body}, human)
    return 0


def _event_line(reply: ApiReply) -> str:
    body = reply.body
    return f"{body.get('connection_id', '?')}: {body.get('desired_state', '?')} ({body.get('outcome', '?')}), HTTP {reply.status}"


def cmd_start(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    reply = _api(args, env).start(args.connection_id, args.ws_url)
    return _reply(args, reply, _event_line(reply))


def cmd_stop(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    reply = _api(args, env).stop(args.connection_id)
    return _reply(args, reply, _event_line(reply))


def cmd_get(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    reply = _api(args, env).get(args.connection_id)
    now = now_ms()
    rows = []
    for key, value in reply.body.items():
        if key == schema.LEASE_EXPIRES_AT_MS and isinstance(value, int):
            value = f"{value}  ({_when(value, now) if value else 'free'})"
        elif key == schema.UPDATED_AT_MS and isinstance(value, int) and value:
            value = f"{value}  ({_when(value, now)})"
        rows.append((key, "-" if value in ("", None) else value))
    return _reply(args, reply, table(("FIELD", "VALUE"), rows))


def _reader(args: argparse.Namespace, env: Mapping[str, str], *needed: str) -> FleetReader:
    session = _session(args, env)
    if args.stack:
        tables = Tables.from_outputs(
            stack_outputs(_client(session, "cloudformation", env), args.stack), args.stack, env
        )
    else:
        tables = Tables.from_env(env)
    tables.need(*needed)
    return FleetReader(_client(session, "dynamodb", env), tables)


def cmd_status(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    status = read_status(_reader(args, env, "connections", "sessions"), now_ms())
    _emit(args, status, render_status(status))
    return 0


def cmd_connections(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    reader = _reader(args, env, "connections", "sessions")
    now = now_ms()
    sessions = reader.sessions()
    if args.worker:
        mine = [s for s in sessions.values() if s.worker_id == args.worker and (s.state == schema.LIVE or s.in_ring)]
        ids = [o.connection_id for s in mine for o in reader.connections.owned_by(s.session_id)]
        items = [i for i in reader.items(ids).values() if not args.state or i.get(schema.DESIRED_STATE) == args.state]
    else:
        items = reader.all_connections(args.state)
    rows = connection_rows(items, sessions, now)
    human = (
        table(
            ("CONNECTION", "STATE", "OWNER", "FENCE", "LAST SEQ", "UPDATED", "WS URL"),
            [
                (
                    r["connection_id"],
                    r["desired_state"],
                    r["owner"],
                    r["fence_token"],
                    r["last_seq"],
                    duration((now - r["updated_at_ms"]) / 1000) + " ago",
                    r["ws_url"],
                )
                for r in rows
            ],
        )
        if rows
        else "no connections"
    )
    _emit(args, rows, human)
    return 0


def cmd_messages(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    reader = _reader(args, env, "messages")
    rows = []
    for item in reader.messages(args.connection_id, from_seq=args.from_seq, limit=args.limit):
        raw = item.get(schema.MESSAGE_DATA, "")
        try:
            data = json.loads(raw)
        except ValueError:
            data = raw
        rows.append(
            {
                "seq": int(item[schema.MSG_SK]),
                "data": data,
                "fence_token": int(item.get(schema.MSG_FENCE_TOKEN, 0)),
                "worker_id": item.get(schema.MSG_WORKER_ID, ""),
                "received_at_ms": int(item.get(schema.RECEIVED_AT_MS, 0)),
            }
        )
    human = (
        table(
            ("SEQ", "RECEIVED (UTC)", "FENCE", "WORKER", "DATA"),
            [
                (
                    r["seq"],
                    _utc(r["received_at_ms"]),
                    r["fence_token"],
                    r["worker_id"],
                    _clip(json.dumps(r["data"]), 60),
                )
                for r in rows
            ],
        )
        if rows
        else f"no messages stored for {args.connection_id} from seq {args.from_seq}"
    )
    _emit(args, rows, human)
    return 0


# --- the command line --------------------------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seq(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON on stdout for scripts, instead of tables")
    common.add_argument(
        "--region", help="AWS region [AWS_REGION, else the default chain's]; an execute-api URL names its own"
    )

    api = argparse.ArgumentParser(add_help=False, parents=[common])
    where = api.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--api",
        metavar="URL",
        help="the API's base URL: http://127.0.0.1:PORT locally, https://ID.execute-api.REGION.amazonaws.com/v1 deployed",
    )
    where.add_argument(
        "--stack",
        metavar="NAME",
        help="read the API URL from the outputs of this service stack (wsfleet-<env>-service)",
    )

    tables = argparse.ArgumentParser(add_help=False, parents=[common])
    tables.add_argument(
        "--stack",
        metavar="NAME",
        help="read the table names from the outputs of this stateful stack (wsfleet-<env>-stateful); "
        "without it they come from TABLE_NAME, SESSIONS_TABLE_NAME and MESSAGES_TABLE_NAME",
    )

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Operate a wsfleet: START, STOP and GET connections through the API, and read the fleet's state from its tables.",
        epilog=(
            "Requests to a deployed API are signed with SigV4 (execute-api) from the default AWS credential chain; a loopback "
            "API (the local one) is not. Table reads take the worker's variables (TABLE_NAME, SESSIONS_TABLE_NAME, "
            "MESSAGES_TABLE_NAME, STATE_SHARDS, AWS_REGION, AWS_ENDPOINT_URL) or --stack, and never write. "
            "Exit status: 0 done; 1 an error, the API's 4xx/5xx included (one sentence on stderr); 2 bad usage."
        ),
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    start = commands.add_parser(
        "start",
        parents=[api],
        help="START a connection (POST /events)",
        description="START a connection: it is created, or restarted from its checkpoint if STOPPED.",
    )
    start.add_argument("connection_id", metavar="CONNECTION_ID")
    start.add_argument("ws_url", metavar="WS_URL", help="ws:// or wss:// URL of the upstream stream")
    start.set_defaults(run=cmd_start)

    stop = commands.add_parser(
        "stop",
        parents=[api],
        help="STOP a connection (POST /events)",
        description="STOP a connection: its owner closes the socket, checkpoints and releases it.",
    )
    stop.add_argument("connection_id", metavar="CONNECTION_ID")
    stop.set_defaults(run=cmd_stop)

    get = commands.add_parser(
        "get",
        parents=[api],
        help="a connection's public state (GET /connections/ID)",
        description="A connection's public state, as GET /connections/{connection_id} answers it.",
    )
    get.add_argument("connection_id", metavar="CONNECTION_ID")
    get.set_defaults(run=cmd_get)

    status = commands.add_parser(
        "status",
        parents=[tables],
        help="the fleet at a glance, from the tables",
        description=(
            "The fleet at a glance. Workers: the LIVE, unexpired sessions (a Scan of the sessions table, which holds one "
            "item per worker run): session age, connections active / max as last renewed, heartbeat age, time to expiry. "
            "Connections by desired state, from a paginated Scan of the connections table (it reads every item, so it "
            "costs what the table's size does: an operator's tool, not a monitor). STARTED but unowned: the FREE# "
            "partitions of the by_owner index (free for: since updated_at_ms) and the connections still attached to a "
            "session that expired or ended (unowned for: since that session's expiry), each checked against its item. "
            "Oldest checkpoint: the owned STARTED connection whose updated_at_ms is oldest; updated_at_ms is the best "
            "proxy the table has (acquire and release write it too, and a connection receiving no frames is not "
            "checkpointed, so an idle one shows its acquisition)."
        ),
    )
    status.set_defaults(run=cmd_status)

    connections = commands.add_parser(
        "connections",
        parents=[tables],
        help="connections, with owner, fence and checkpoint",
        description=(
            "Connections with their owner, fence token, checkpoint (last_seq) and last update. With --worker, the "
            "connections attached to that worker's sessions (by_owner index queries, then a BatchGetItem); without it, "
            "a paginated Scan of the connections table."
        ),
    )
    connections.add_argument("--worker", metavar="WORKER_ID", help="only those attached to this worker's sessions")
    connections.add_argument("--state", choices=(schema.STARTED, schema.STOPPED), help="only this desired state")
    connections.set_defaults(run=cmd_connections)

    messages = commands.add_parser(
        "messages",
        parents=[tables],
        help="a connection's stored messages",
        description="A connection's stored messages in seq order (a Query of the messages table).",
    )
    messages.add_argument("connection_id", metavar="CONNECTION_ID")
    messages.add_argument("--from-seq", type=_seq, default=0, metavar="N", help="first seq to show [0: from the start]")
    messages.add_argument("--limit", type=_positive, default=20, metavar="N", help="at most this many [20]")
    messages.set_defaults(run=cmd_messages)
    return parser


def _aws_sentence(error: Exception) -> str:
    if isinstance(error, NoCredentialsError):
        return "no AWS credentials found: configure a profile or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    if isinstance(error, NoRegionError):
        return "no AWS region: pass --region or set AWS_REGION"
    if isinstance(error, ClientError):
        err = error.response.get("Error", {})
        sentence = f"{error.operation_name} failed: {err.get('Message') or 'no message'} ({err.get('Code', 'error')})"
        if err.get("Code") == "ResourceNotFoundException":
            sentence += "; check the table names (or --stack) and the region"
        return sentence
    return str(error)


def main(argv: Sequence[str] | None = None, *, env: Mapping[str, str] | None = None) -> int:
    """Run one command; returns the exit status. ``env`` stands for ``os.environ``."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help, or bad usage (argparse has said why)
        return int(exit_.code or 0)
    env = os.environ if env is None else env
    try:
        return args.run(args, env)
    except CliError as error:
        sentence = str(error)
    except (BotoCoreError, ClientError, TransientError, config.ConfigError) as error:
        sentence = _aws_sentence(error)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `wsfleet connections | head`: the reader is gone; keep the final flush quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as error:  # noqa: BLE001 - an operator sees a sentence, never a traceback
        sentence = f"unexpected {type(error).__name__}: {error}"
    print(f"{PROG}: {sentence.rstrip('.')}.", file=sys.stderr)
    return 1
