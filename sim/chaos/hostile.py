"""Hostile peers in a chaos run (``--hostile``): one connection of each hostile kind
(:data:`.hostile_check.KINDS`), STARTed with the soak's others, each with the URL that
asks the local upstream for its attack; their ``last_error`` polled through the API as
the run goes; their evidence gathered for :mod:`.hostile_check`, which judges them."""

from __future__ import annotations

import time
from typing import Callable

from ..fleet import Fleet
from .evidence import rows_of
from .hostile_check import KINDS, POLL_S, HostileEvidence, connection_id

API_PATIENCE_S = 30.0


class HostilePeers:
    def __init__(self, fleet: Fleet, say: Callable[[str], None]) -> None:
        self.fleet = fleet
        self.say = say
        self.ids = [connection_id(kind) for kind in KINDS]
        self.errors: dict[str, list[tuple[float, str]]] = {cid: [] for cid in self.ids}
        self._polled_at = 0.0
        self.started_at = 0.0  # when the last hostile START was answered

    def start(self) -> None:
        for kind, query in KINDS.items():
            cid = connection_id(kind)
            self.fleet.upstream.create_stream(cid)
            self._api({"event_type": "START", "connection_id": cid, "ws_url": self.fleet.ws_url(cid) + "?" + query})
            self.say(f"           hostile peer {cid}: {query}")
        self.started_at = time.time()

    def stop(self) -> None:
        for cid in self.ids:
            self._api({"event_type": "STOP", "connection_id": cid})

    def _api(self, body: dict) -> None:
        """As the nemesis's clients do: retried on 5xx and 429."""
        deadline = time.monotonic() + API_PATIENCE_S
        while True:
            try:
                status, answer = self.fleet.request("POST", "/events", body)
            except (OSError, ValueError) as exc:
                status, answer = 599, {"message": str(exc)}
            if status < 500 and status != 429 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if status >= 400:
            raise RuntimeError(f"{body['event_type']} {body['connection_id']} answered {status}: {answer}")

    def watch(self) -> None:
        """Every POLL_S: each hostile connection's last_error, as GET /connections says it,
        noted when it changes. Cheap enough to call as often as the run likes."""
        now = time.time()
        if now - self._polled_at < POLL_S:
            return
        self._polled_at = now
        for cid in self.ids:
            try:
                status, item = self.fleet.request("GET", f"/connections/{cid}")
            except (OSError, ValueError):
                continue  # the next poll reads it
            text = item.get("last_error") or "" if status == 200 else None
            seen = self.errors[cid]
            if text is not None and (not seen or seen[-1][1] != text):
                seen.append((now, text))

    def evidence(self, chaos: tuple[float, float]) -> HostileEvidence:
        upstream = self.fleet.upstream
        rows = {cid: rows_of(self.fleet.messages_store.read_all(cid)) for cid in self.ids}
        first = {cid: min((s.opened_at for s in upstream.sockets(cid)), default=None) for cid in self.ids}
        return HostileEvidence(
            rows=rows,
            frames={cid: upstream.expected_data(cid) for cid in self.ids},
            first_socket_at=first,
            errors=self.errors,
            chaos=chaos,
            held_handshakes={cid: upstream.held_handshakes(cid) for cid in self.ids if upstream.held_handshakes(cid)[0]},
        )
