"""The plan's shared model: what one cost benchmark run measured (:class:`Op`,
:class:`Measured`, read from ``measured_ops.json``), DynamoDB's partition and table
limits and the prices more than one part of the plan uses (the stacks' environments, as
a plan reads them: :mod:`wsfleet.plan.environments`). Pure data, no AWS calls; every
other module of :mod:`wsfleet.plan` builds on this one.

The cost benchmark measures, per worker-hour, how many requests of each kind a worker
sends while holding (renewal, watch, ring, free scan, audit, UnownedConnections counts),
which table, index and partition each one reaches, and what each costs in capacity
units (from real item sizes); it writes them to ``wsfleet/measured_ops.json``, with the
commit and command that measured them. Every one of those rates is per worker, so a
fleet of W workers sends W times as many; where they land (an op's ``spread``) decides
what they load:

* ``own``: a partition of the worker's own (its session item, its ``S#<session>``
  partition of ``by_owner``), or of one of its ring successors: the load per partition
  is one worker's, whatever the fleet's size;
* ``shards``: the ``FREE#<shard>`` partitions of ``by_owner``, shared by every worker:
  W / STATE_SHARDS workers' load on each;
* ``ring``: the one ``RING`` partition of ``by_ring``: every worker's load on it;
* ``fleet``: sent by one worker for the whole fleet (the summarizer): its rate is the
  fleet's, whatever the fleet's size (see :mod:`wsfleet.plan.corrections` for the ops
  whose units grow with it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

# Prices more than one part of the plan uses, declared with the others in :mod:`.prices`.
from .prices import DYNAMODB_STORAGE_GB_MONTH, S3_PRICES  # noqa: F401

PARTITION_RCU = 3000  # read units per second per partition (eventually consistent 4 KB read = 0.5)
PARTITION_WCU = 1000
TABLE_QUOTA = 40000  # on-demand read or write units per second per table or index (default quota)
HOURS_PER_MONTH = 730
TRANSACTION_FACTOR = 2  # a write inside TransactWriteItems costs twice its units

PRICES_REGION = "us-east-1"  # the one region whose list prices the plan carries



@dataclass(frozen=True)
class Op:
    """One kind of request a worker sends while holding, as measured."""

    purpose: str  # "renewal", "watch", ...
    table: str  # "sessions" | "connections" | "messages"
    index: str  # "" for the table itself
    spread: str  # "own" | "shards" | "ring" | "fleet" (see the module docstring)
    per_worker_hour: float  # requests (spread "fleet": requests of the whole fleet, one worker's)
    wru: float = 0.0  # write units per request (index writes included)
    rru: float = 0.0  # read units per request
    # Read units that grow with the connections a worker holds (the audit reads every
    # index entry of its own partition): bytes per connection; 0 when it does not grow.
    bytes_per_connection: float = 0.0
    partition: str = ""  # spread "fleet": the partition it lands on, named

    def rru_at(self, per_worker: int) -> float:
        if not self.bytes_per_connection:
            return self.rru
        return 0.5 * max(1, math.ceil(per_worker * self.bytes_per_connection / 4096))


# --- the measured inputs ----------------------------------------------------------------

# Package data of wsfleet (runtime/pyproject.toml): in wsfleet/, beside this package, where
# the cost benchmark writes it and the stacks leave it out of the Lambda.
MEASURED_OPS = Path(__file__).parent.parent / "measured_ops.json"

@dataclass(frozen=True)
class Measured:
    """What one cost benchmark run measured, and where it came from."""

    ops: tuple[Op, ...]
    fixed_per_worker_hour: Mapping[str, float]  # SQS and CloudWatch requests
    message_wru: float  # write units per stored message
    checkpoint_wru: float  # write units per checkpoint (index writes included)
    prices: Mapping[str, float]
    measured_with: Mapping[str, Any]  # command, commit, date, timings

    @property
    def checkpoint_units(self) -> float:
        """Write units a checkpoint costs: the writer checkpoints in TransactWriteItems,
        and a transactional write costs twice the item's units (``checkpoint_wru`` is the
        item's plain units, as the cost benchmark measures them: 1, so 2 in all)."""
        return TRANSACTION_FACTOR * self.checkpoint_wru

    def message_wru_per_connection_hour(self, rate: float, checkpoint_s: float) -> float:
        """Write units of a connection receiving ``rate`` messages per second: its
        messages plus a checkpoint every ``checkpoint_s`` (none when quiet)."""
        if rate <= 0:
            return 0.0
        return rate * 3600 * self.message_wru + 3600 / checkpoint_s * self.checkpoint_units

    def as_json(self) -> dict[str, Any]:
        return {
            "ops": [vars(op) for op in self.ops],
            "fixed_per_worker_hour": dict(self.fixed_per_worker_hour),
            "message_wru": self.message_wru,
            "checkpoint_wru": self.checkpoint_wru,
            "prices": dict(self.prices),
            "measured_with": dict(self.measured_with),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Measured":
        return cls(
            ops=tuple(Op(**op) for op in d["ops"]),
            fixed_per_worker_hour=d["fixed_per_worker_hour"],
            message_wru=float(d["message_wru"]),
            checkpoint_wru=float(d["checkpoint_wru"]),
            prices=d["prices"],
            measured_with=d["measured_with"],
        )


def load_measured(path: Path | None = None) -> Measured:
    """The per-operation counts ``make bench`` last measured (shipped with the package)."""
    return Measured.from_json(json.loads((path or MEASURED_OPS).read_text()))


def measured_shards(measured: Measured, default: int) -> int:
    """The STATE_SHARDS the free scans were measured at."""
    return int(measured.measured_with.get("timings", {}).get("shards", default))
