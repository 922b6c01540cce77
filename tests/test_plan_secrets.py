"""`wsfleet plan`'s price of upstream secrets (issue 20), checked against computations of
its own: the dollars by hand, and the worker cache's fetch rate by simulating the cache
(connects at random times, a value reused for the cache period) instead of by formula."""

from __future__ import annotations

import json
import random

import pytest

from wsfleet.plan import environments
from wsfleet.plan import secrets as plan_secrets
from wsfleet.cli import main


def _simulated_fetches_per_hour(*, workers: int, per_worker: int, secrets: int, reconnects: float, cache_s: float,
                                hours: float, seed: int) -> float:
    """Fetches per hour of ``workers`` workers, each holding ``per_worker`` connections whose
    secrets are drawn at random, each connection connecting at random times (Poisson,
    ``reconnects`` an hour): a connect fetches its secret unless this worker fetched it less
    than ``cache_s`` ago."""
    rng = random.Random(seed)
    fetches = 0
    for _ in range(workers):
        secret_of = [rng.randrange(secrets) for _ in range(per_worker)]
        fetched_at: dict[int, float] = {}
        t = 0.0
        while True:
            t += rng.expovariate(per_worker * reconnects / 3600)  # the next connect of any of them (s)
            if t > hours * 3600:
                break
            secret = secret_of[rng.randrange(per_worker)]
            if secret not in fetched_at or t - fetched_at[secret] > cache_s:
                fetched_at[secret] = t
                fetches += 1
    return fetches / hours


@pytest.mark.parametrize(
    "secrets, reconnects",
    [
        (1, 1.0),  # one shared secret, connects far more often than the cache period: ~one per period
        (10, 1.0),  # in between: the cache saves about half the fetches
        (30, 1.0),  # uneven: some secrets have many connections on a worker, some few
        (100, 1.0),
        (1000, 1.0),  # nearly a secret per connection: about one fetch per connect
        (10, 0.05),  # rare connects: one fetch per connect
    ],
)
def test_cached_fetches_match_a_simulation_of_the_workers_cache(secrets, reconnects):
    per_worker, workers = 100, 12
    result = plan_secrets.secrets_month(
        connections=per_worker * workers,
        per_worker=per_worker,
        secrets=secrets,
        reconnects_per_hour=reconnects,
        rotations_per_month=0,
    )
    simulated = _simulated_fetches_per_hour(
        workers=workers, per_worker=per_worker, secrets=secrets, reconnects=reconnects,
        cache_s=plan_secrets.SECRET_CACHE_SECONDS, hours=400 / reconnects, seed=20,
    )
    # 12 workers x ~40,000 connects each: the sampling error is about 1 %. (The rate at the
    # average number of connections per secret, instead of the expectation over it, is
    # 3-4 % high at 30 and 100 secrets.)
    assert result["calls_per_hour"]["cached"] == pytest.approx(simulated * plan_secrets.CALLS_PER_FETCH, rel=0.02)
    assert result["calls_per_hour"]["total"] == result["calls_per_hour"]["cached"]


def test_the_fetch_rate_is_bounded_by_one_per_connect_and_one_per_cache_period():
    for rate in (0.01, 1, 12, 100, 10_000):
        fetched = plan_secrets.cached_fetch_rate(rate, 300)
        assert fetched <= rate and fetched <= 3600 / 300
    assert plan_secrets.cached_fetch_rate(1e9, 300) == pytest.approx(12, rel=1e-6)
    assert plan_secrets.cached_fetch_rate(0, 300) == 0


def test_dollars_by_hand_for_one_shared_secret():
    # 10,000 connections, 100 per worker: 100 workers, each with all 10,000 / 100 = 100 of
    # its connections on the one secret, 100 connects an hour between them. A fetch serves
    # 300 s; the next connect after that comes 1/100 h later on average: one fetch per
    # (1/12 + 1/100) h = 1200/112 an hour, per worker.
    result = plan_secrets.secrets_month(connections=10_000, per_worker=100, secrets=1, reconnects_per_hour=1)
    per_worker_h = 1 / (1 / 12 + 1 / 100)
    assert per_worker_h == pytest.approx(1200 / 112)
    cached = 100 * per_worker_h
    rotations = 1 * 100 * 1 / 730  # one rotation a month, one refetch on each of 100 workers
    # Each fetch is two calls: GetSecretValue, and DescribeSecret for its wsfleet:hosts tag.
    assert plan_secrets.CALLS_PER_FETCH == 2
    calls_month = 2 * (cached + rotations) * 730
    assert result["calls_per_month"] == pytest.approx(calls_month)
    assert calls_month == pytest.approx(2 * 782_242.86, abs=0.02)
    assert result["month"]["calls"] == pytest.approx(calls_month * 0.05 / 10_000)
    assert result["month"]["secrets"] == pytest.approx(0.40)
    assert result["month"]["total"] == pytest.approx(2 * 3.9112 + 0.40, abs=2e-4)
    assert result["per_connection_hour"] == pytest.approx(result["month"]["total"] / (10_000 * 730))
    assert result["calls_per_connection_hour"] == pytest.approx(2 * (cached + rotations) / 10_000)


def test_a_connection_refused_for_good_costs_a_fetch_per_retry():
    quiet = plan_secrets.secrets_month(connections=1000, per_worker=100, secrets=5, reconnects_per_hour=0.5)
    refused = plan_secrets.secrets_month(connections=1000, per_worker=100, secrets=5, reconnects_per_hour=0.5, refused=10)
    # 10 connections retrying every 60 s, each retry refused once more after fetching again.
    assert refused["calls_per_hour"]["refused"] == pytest.approx(2 * 10 * 60)
    assert refused["month"]["calls"] - quiet["month"]["calls"] == pytest.approx(2 * 10 * 60 * 730 / 10_000 * 0.05)
    assert refused["month"]["calls"] - quiet["month"]["calls"] == pytest.approx(4.38)


def test_the_expectation_over_how_many_connections_name_each_secret_by_hand():
    # Two connections, two secrets: a given secret is named by one of them with
    # probability 1/2 and by both with 1/4.
    f = plan_secrets.cached_fetch_rate
    assert plan_secrets.cached_fetches_per_worker(2, 2, 6.0, 300) == pytest.approx(2 * (0.5 * f(6.0, 300) + 0.25 * f(12.0, 300)))
    assert f(6.0, 300) == pytest.approx(6 / 1.5) and f(12.0, 300) == pytest.approx(12 / 2)
    assert plan_secrets.cached_fetches_per_worker(0, 2, 6.0, 300) == plan_secrets.cached_fetches_per_worker(2, 0, 6.0, 300) == 0
    # One secret: every connection names it. And a task of thousands (math.comb(2415, n) is
    # past a float): the probabilities still sum to one, so the rate stays under n x 12 an hour.
    assert plan_secrets.cached_fetches_per_worker(3, 1, 6.0, 300) == pytest.approx(f(18.0, 300))
    big = plan_secrets.cached_fetches_per_worker(2415, 20, 2.0, 300)
    assert 20 * f(2415 / 20 * 2.0 * 0.9, 300) < big <= 20 * 12


def test_distinct_secrets_per_worker():
    assert plan_secrets.distinct_secrets(1, 70) == 1
    assert plan_secrets.distinct_secrets(0, 70) == 0
    # Two secrets, two connections: both with probability 1/2, one otherwise.
    assert plan_secrets.distinct_secrets(2, 2) == pytest.approx(1.5)
    assert plan_secrets.distinct_secrets(10_000, 70) == pytest.approx(70, rel=0.01)


# --- the command ------------------------------------------------------------------------------


def test_plan_prices_secrets_with_the_environments_workers(capsys):
    argv = ["plan", "--connections", "100000", "--env", "prod", "--secrets", "20", "--reconnects", "2", "--json"]
    assert main(argv, env={}) == 0
    out = json.loads(capsys.readouterr().out)
    expected = plan_secrets.secrets_month(connections=100_000, per_worker=1690, secrets=20, reconnects_per_hour=2)
    assert environments.load("prod")["target_per_worker"] == 1690
    assert out["secrets"]["workers"] == 60 == out["holding"]["workers"]
    assert out["secrets"]["month"]["total"] == pytest.approx(expected["month"]["total"])
    assert out["secrets"]["cache_s"] == plan_secrets.SECRET_CACHE_SECONDS == 300


def test_plan_in_tables_shows_the_secrets_price_per_connection_hour(capsys):
    assert main(["plan", "--connections", "10000", "--secrets", "1", "--refused", "3"], env={}) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("Secrets Manager"))
    assert "GetSecretValue" in line and "per connection-hour" in line and "per million connection-hours" in line
    assert "1 secret " in line and "3 refused" in line


def test_plan_without_secrets_says_how_to_price_them(capsys):
    assert main(["plan", "--connections", "10000"], env={}) == 0
    out = capsys.readouterr().out
    assert "Secrets Manager: no secret_headers priced (--secrets N " in out


def test_plan_refuses_refused_connections_beyond_the_fleet(capsys):
    assert main(["plan", "--connections", "10", "--secrets", "1", "--refused", "11"], env={}) == 1
    assert "--refused" in capsys.readouterr().err
