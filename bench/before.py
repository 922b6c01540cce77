"""The figures published before session leases: per-connection leases, as BENCHMARKS.md
stood at commit c38e369 (cost, capacity and ingestion measured at f607dc1, failover at
7dbb128, on the same kind of 2-core shared VM). Every table prints them as its "before"
column, so that a run of the new code is read beside what it replaced. They are
constants: the old protocol is gone, so they cannot be measured again.
"""

from __future__ import annotations

LABEL = "before (per-connection leases, c38e369)"

# bench failover, p50 / p99 / max in seconds, at the defaults then (lease 20 / heartbeat
# 5 / reconcile 10 s) and at lease 10 / heartbeat 2.5 / reconcile 5 s.
FAILOVER = {
    "start_burst": "0.03 / 0.07 / 0.13 (20/5); 0.03 / 0.07 / 0.07 (10/2.5)",
    "start_one": "0.03 / 0.16 / 0.16 (20/5); 0.04 / 0.15 / 0.16 (10/2.5)",
    "crash_acquired": "19.53 / 24.33 / 26.06 (20/5); 10.17 / 14.14 / 14.17 (10/2.5)",
    "crash_socket": "19.53 / 24.33 / 26.07 (20/5); 10.18 / 14.14 / 14.17 (10/2.5)",
    "handoff_socket": "0.71 / 1.00 / 1.10 (20/5); 0.69 / 1.10 / 1.10 (10/2.5)",
    "handoff_no_socket": "0.70 / 0.99 / 1.08 (20/5); 0.68 / 1.06 / 1.07 (10/2.5)",
    "handoff_no_owner": "0.39 / 0.58 / 0.61 (20/5); 0.49 / 0.69 / 0.69 (10/2.5)",
    "stop": "1.40 / 4.74 / 4.97 (20/5); 0.51 / 2.34 / 2.50 (10/2.5)",
}

# bench cost: one worker, 40 connections, lease 20 / heartbeat 5 / reconcile 10 s.
COST = {
    "renewals_per_connection_hour": 721,  # one UpdateItem per connection per heartbeat
    "index_writes_per_renewal": 2,  # the renewal moved the sort key of by_state_expiry
    "wru_per_connection_hour": 2163,  # 721 table + 1442 index
    "rru_per_connection_hour": 10.7,
    "dynamodb_requests_per_connection_hour": 742.5,  # 721 renewals + 21.5 queries (2,147 per worker-hour / 100)
    "sqs_requests_per_connection_hour": 14.4,  # 4 long polls of 10 s per worker, / 100
    "cloudwatch_requests_per_connection_hour": 0.6,  # one PutMetricData a minute per worker, / 100
    "month_holding_per_1000": 997,  # of which 658 was index write amplification
    "wru_per_message": 1,
    "month_per_million_messages": 0.625,
}

# bench capacity: one worker, 1,000 quiet connections (+20 busy), lease 90 / heartbeat 30 s
# (the default 5 s heartbeat would have needed 200 renewals/s, beyond one moto server).
CAPACITY = {
    "connections": "1000 (+20 busy), at HEARTBEAT 30 s",
    "memory_kb_slope": "26 KB",
    "memory_kb_avg": "21 KB",
    "lag_hold": "7.7 / 8.7 ms",
    "lag_busy": "8.0 / 78.0 ms",
    "lag_connect": "90 ms",
    "renewals": "31.9 / 33.3 per s (N / heartbeat)",
    "cpu_hold": "13.7 % of a core = 0.49 CPU-s per connection-hour",
    "cpu_per_message": "0.537 ms",
    "emulator_cpu": "20 % / 26 %",
    "connect": "7.4 s / 7.5 s (500 each)",
    "shutdown": "19.6 s, released 1020, left 0",
}

# bench ingestion, per row (connections x rate, flush): stored msg/s, DynamoDB req / msg,
# worker CPU ms / msg; lease 20 / heartbeat 5 s then.
INGESTION = {
    (10, 5.0, 100): "50, 1.066, 3.16",
    (10, 20.0, 100): "200, 0.392, 0.90",
    (10, 100.0, 100): "1001, 0.097, 0.27",
    (20, 100.0, 100): "2001, 0.094, 0.27",
    (10, 20.0, 1000): "203, 0.065, 0.45",
}
