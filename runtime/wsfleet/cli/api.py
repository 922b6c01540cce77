"""The API as any caller reaches it: ``POST /events``, ``GET`` and ``DELETE
/connections/{id}`` and ``GET /connections/{id}/messages`` over HTTP, signed with SigV4 for ``execute-api`` by
botocore's signer, except a local API on loopback, which has no authorizer."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

from ..credentials import is_loopback_host
from .errors import CliError

API_SERVICE = "execute-api"
HTTP_TIMEOUT_S = 10  # an API out of reach is a sentence within this, never a silent minute
_REGION_IN_HOST = re.compile(r"\.execute-api\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?")


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
    """A loopback API is the local stand-in (``sim.api``): nothing to sign."""
    return is_loopback_host(urllib.parse.urlsplit(url).hostname or "")


def region_in_url(url: str) -> str | None:
    """The region of an ``execute-api`` host name, if the URL is one."""
    match = _REGION_IN_HOST.search(urllib.parse.urlsplit(url).hostname or "")
    return match.group(1) if match else None


def urlopen(request: urllib.request.Request, *, direct: bool) -> tuple[int, bytes]:
    """Send a request: (status, body), a 4xx/5xx included; an API out of reach is a CliError."""
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
        self._send = send or (lambda request: urlopen(request, direct=local))

    def start(self, connection_id: str, ws_url: str, upstream: Mapping[str, Any] | None = None) -> ApiReply:
        """``upstream``: the START's upstream object; None sends none (the default protocol)."""
        body: dict[str, Any] = {"event_type": "START", "connection_id": connection_id, "ws_url": ws_url}
        if upstream is not None:
            body["upstream"] = dict(upstream)
        return self.request("POST", "/events", body)

    def stop(self, connection_id: str) -> ApiReply:
        return self.request("POST", "/events", {"event_type": "STOP", "connection_id": connection_id})

    def get(self, connection_id: str) -> ApiReply:
        return self.request("GET", _connection_path(connection_id))

    def delete(self, connection_id: str) -> ApiReply:
        return self.request("DELETE", _connection_path(connection_id))

    def messages(self, connection_id: str, *, after_seq: int, limit: int) -> ApiReply:
        query = urllib.parse.urlencode({"after_seq": after_seq, "limit": limit})
        return self.request("GET", f"{_connection_path(connection_id)}/messages?{query}")

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


def _connection_path(connection_id: str) -> str:
    # Ids are A-Za-z0-9._:- ; anything else is encoded, and the router answers 400.
    return "/connections/" + urllib.parse.quote(connection_id, safe=":")


def _json_object(raw: bytes) -> dict:
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    text = raw.decode("utf-8", "replace").strip()
    return {"message": text[:300] or "empty response"}
