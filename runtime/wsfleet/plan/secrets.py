"""What upstream secrets cost (issue 20). START's secret_headers name Secrets Manager
secrets whose values the worker fetches (GetSecretValue) at connect time and keeps in a
cache shared by its connections. What that costs: the API calls and the secrets
themselves. Pure arithmetic, no AWS calls.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .model import HOURS_PER_MONTH

# Secrets Manager, us-east-1 list prices (December 2026): check them before relying on them.
SECRETS_PRICES = {"per_10k_calls": 0.05, "secret_month": 0.40}
# Calls per fetch: GetSecretValue, and DescribeSecret for the secret's wsfleet:hosts tag
# (the hosts it may be sent to: worker/secrets.py reads both, cached together).
CALLS_PER_FETCH = 2
# How long a worker reuses a fetched value for another connect. worker/secrets.py keeps the
# same figure: the two must match for the plan to price what the worker does.
SECRET_CACHE_SECONDS = 300
# How long a refused connection waits before it connects again (the worker's
# REFUSED_RETRY_S, jittered around it).
REFUSED_RETRY_SECONDS = 60


def distinct_secrets(secrets: int, per_worker: float) -> float:
    """How many of ``secrets`` a worker holding ``per_worker`` connections needs, on
    average, when each connection names one secret, all equally often, and connections
    land on workers regardless of their secret: each secret is missing from the worker
    with probability (1 - 1/secrets) ** per_worker."""
    if secrets <= 0:
        return 0.0
    return secrets * (1 - (1 - 1 / secrets) ** per_worker)


def cached_fetch_rate(connects_per_hour: float, cache_s: float) -> float:
    """Fetches per hour of one secret on one worker whose connections naming it connect
    ``connects_per_hour`` times an hour (at random times): a fetch serves every connect
    for ``cache_s``; the first connect after that fetches again, 1 / rate later on
    average. So one cycle is cache_s + 1 / rate: never more than one fetch per connect
    nor one per cache period."""
    if connects_per_hour <= 0:
        return 0.0
    return connects_per_hour / (1 + connects_per_hour * cache_s / 3600)


def cached_fetches_per_worker(held: int, secrets: int, reconnects_per_hour: float, cache_s: float) -> float:
    """Fetches per hour of a worker holding ``held`` connections, each naming one of
    ``secrets`` (equally often, regardless of the worker): n of them name a given secret
    with the binomial probability of n in ``held`` at 1 / ``secrets``, and those n connect
    n x ``reconnects_per_hour`` times an hour. The expectation over n, not the rate at the
    average n: the fetch rate flattens as connects grow, so the average would overstate
    it (by about 4 % at 100 connections on 30 secrets)."""
    if secrets <= 0 or held <= 0:
        return 0.0
    if secrets == 1:
        return cached_fetch_rate(held * reconnects_per_hour, cache_s)
    per_secret = sum(_binomial(held, n, 1 / secrets) * cached_fetch_rate(n * reconnects_per_hour, cache_s)
                     for n in range(1, held + 1))
    return secrets * per_secret


def _binomial(trials: int, n: int, p: float) -> float:
    """P(n successes in ``trials`` at ``p``), 0 < p < 1, in log space: math.comb(2000, n)
    and p**n alone overflow or underflow a float at the task sizes the plan considers."""
    log_pmf = (math.lgamma(trials + 1) - math.lgamma(n + 1) - math.lgamma(trials - n + 1)
               + n * math.log(p) + (trials - n) * math.log1p(-p))
    return math.exp(log_pmf)


def secrets_month(
    *,
    connections: int,
    per_worker: int,
    secrets: int,
    reconnects_per_hour: float,
    refused: int = 0,
    rotations_per_month: float = 1.0,
    cache_s: float = SECRET_CACHE_SECONDS,
    refused_retry_s: float = REFUSED_RETRY_SECONDS,
    prices: Mapping[str, float] = SECRETS_PRICES,
) -> dict[str, Any]:
    """Secrets Manager for ``connections`` (``per_worker`` on each worker) that name
    ``secrets`` distinct secrets, one each, and connect ``reconnects_per_hour`` times an
    hour each (reconnects, takeovers and handoffs): GetSecretValue calls and $ per month.

    * cached: per worker, :func:`cached_fetches_per_worker`;
    * refused: each of ``refused`` connections whose upstream keeps refusing it connects
      every ``refused_retry_s``, and each 401/403 fetches its secret again (once);
    * rotations: after a rotation, the first connect on each worker holding the secret
      may be refused with the old value and fetch it again (at most one per worker and
      secret: the new value is then in the shared cache).
    """
    workers = math.ceil(connections / per_worker)
    held = round(connections / workers)  # connections per worker, on average
    in_use = distinct_secrets(secrets, held)  # per worker
    calls_h = {
        "cached": workers * cached_fetches_per_worker(held, secrets, reconnects_per_hour, cache_s),
        "refused": refused * 3600 / refused_retry_s,
        "rotations": rotations_per_month * workers * in_use / HOURS_PER_MONTH,
    }
    calls_h = {kind: fetches * CALLS_PER_FETCH for kind, fetches in calls_h.items()}
    calls_h["total"] = sum(calls_h.values())
    calls_month = calls_h["total"] * HOURS_PER_MONTH
    dollars = {
        "calls": calls_month / 10_000 * prices["per_10k_calls"],
        "secrets": secrets * prices["secret_month"],
    }
    dollars["total"] = dollars["calls"] + dollars["secrets"]
    connection_hours = connections * HOURS_PER_MONTH
    return {
        "connections": connections,
        "workers": workers,
        "secrets": secrets,
        "secrets_per_worker": in_use,
        "reconnects_per_hour": reconnects_per_hour,
        "refused": refused,
        "rotations_per_month": rotations_per_month,
        "cache_s": cache_s,
        "calls_per_hour": calls_h,
        "calls_per_month": calls_month,
        "calls_per_connection_hour": calls_h["total"] / connections,
        "month": dollars,
        "per_connection_hour": dollars["total"] / connection_hours,
    }
