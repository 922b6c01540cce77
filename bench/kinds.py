"""Upstream kinds the benchmarks run with: the default protocol, or an authenticated,
subscribe-style source (CONTRACT.md section 3, the START's ``upstream`` object)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from sim.secrets import put_secret

DEFAULT_KIND = "default"
AUTH_SUBSCRIBE = "auth+subscribe"
KIND_HEADER = "X-Api-Key"


@dataclass(frozen=True)
class UpstreamKind:
    """How a benchmark's connections reach their upstream: the default protocol, or
    authenticated + subscribe-style (a secret header from Secrets Manager, the resume
    point only in a subscribe open message), the cost of a real source's handshake."""

    name: str = DEFAULT_KIND
    credential: str = ""  # the value the upstream accepts (in the secret too)
    secret_arn: str = ""

    @classmethod
    def auth_subscribe(cls, endpoint_url: str) -> "UpstreamKind":
        """Its credential put in the emulator's Secrets Manager (under the embedded
        default's UPSTREAM_SECRET_PREFIX)."""
        value = "bench-" + secrets.token_urlsafe(12)
        return cls(AUTH_SUBSCRIBE, value, put_secret(endpoint_url, f"bench/{secrets.token_hex(4)}", value))

    @property
    def label(self) -> str:
        return "" if self.name == DEFAULT_KIND else "authenticated + subscribe"

    @property
    def credentials(self) -> list[str]:
        return [self.credential] if self.credential else []

    def ws_url(self, stream_url: str) -> str:
        """What configures the local upstream's kind: the stream URL's query."""
        return stream_url if self.name == DEFAULT_KIND else f"{stream_url}?auth_header={KIND_HEADER}&subscribe=1"

    def upstream(self) -> dict[str, Any] | None:
        """The START's upstream object (None: the default protocol)."""
        if self.name == DEFAULT_KIND:
            return None
        return {
            "secret_headers": {KIND_HEADER: self.secret_arn},
            "open_message": '{"op":"subscribe","stream":"{connection_id}","from_seq":{from_seq}}',
            "resume": "open_message",
        }


DEFAULT = UpstreamKind()
