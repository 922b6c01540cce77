"""wsfleet benchmarks: failover, cost, capacity and ingestion on the embedded default.

``python -m bench [failover|cost|capacity|ingestion|all] [--quick]`` (``make bench``).
Each benchmark runs real processes (the moto emulator, the upstream, workers), prints
its figures as a markdown table with the exact command that produced them, and writes
the raw results as JSON under ``.bench/``. See BENCHMARKS.md for the latest figures.
"""
