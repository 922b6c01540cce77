"""The fleet summary as this worker last knew it.

Two roles bring it: the summarizer's own ring read (:meth:`.balancer.Balancer.summarize_once`)
and every other worker's watch read (:meth:`.takeover.Takeover.watch_once`). The hint
intake, the free scan and the balancer read it; one older than
:data:`wsfleet.balance.SUMMARY_MAX_AGE_MS` is not acted on.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Mapping

from ..balance import FleetLoad
from ..store import now_ms


class FleetSummary:
    def __init__(self, *, clock_ms: Callable[[], int] = now_ms) -> None:
        self.fleet: FleetLoad | None = None
        # Set by each summary that arrives: a balance pass follows at once (see
        # ``Worker._balance_loop``), so a join is acted on as soon as each worker reads of
        # it, not up to a pass later.
        self.arrived = asyncio.Event()
        self._clock_ms = clock_ms

    def on_item(self, item: Mapping) -> None:
        """The summary item, as a watch read brought it."""
        self.known(FleetLoad.from_item(item))

    def known(self, fleet: FleetLoad) -> None:
        self.fleet = fleet
        self.arrived.set()

    def fresh(self) -> FleetLoad | None:
        fleet = self.fleet
        if fleet is None or not fleet.fresh_at(self._clock_ms()):
            return None
        return fleet
