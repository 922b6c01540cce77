"""A connection runner's settings (:class:`~wsfleet.worker.connection.ConnectionRunner`):
the worker's, the same for every connection it holds."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import DEFAULT_MAX_FRAME_BYTES
from ..validation import Allowlist
from .decoder import IN_LOOP, FrameDecoder
from .gate import ReceiveGate
from ..proxy_tunnel import Proxy
from .upstream_socket import REFUSED_RETRY_S, SocketOptions


@dataclass(frozen=True)
class Settings:
    worker_id: str
    checkpoint_s: float = 120.0  # longest time between checkpoints while frames arrive
    # A checkpoint is asked for this share of checkpoint_s before it is due, so that it
    # can leave together with other connections' ones (worker.checkpoints).
    checkpoint_gather_share: float = 0.1
    connect_timeout_s: float = 10.0
    ping_interval_s: float = 20.0
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES  # the worker's is config.max_frame_bytes
    allowlist: Allowlist = Allowlist.of(())  # hosts allowed to resolve to internal addresses
    gate: ReceiveGate | None = None  # the worker's receive slots for large frames; None: unbounded
    decoder: FrameDecoder = IN_LOOP  # the worker's, which parses large frames off the loop
    refused_retry_s: float = REFUSED_RETRY_S  # the wait after a refused handshake (jittered)
    upstream_secret_prefix: str = ""  # secrets a stored upstream may name (config.upstream_secret_prefix)
    region: str | None = None  # the region those secrets must be in (config.region; None: any)
    proxy: Proxy | None = None  # UPSTREAM_PROXY (config.upstream_proxy): upstream sockets tunnel through it

    @property
    def socket_options(self) -> SocketOptions:
        return SocketOptions(
            self.connect_timeout_s, self.ping_interval_s, self.max_frame_bytes, self.allowlist, self.gate, self.proxy
        )
