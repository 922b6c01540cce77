"""``PYTHONPATH=runtime:. python -m bench.sink_cpu [--frames 500] [--bytes 200] [--rounds 20]``

The writer's CPU per message in each sink, in one run, on the same frames: the client
side of ``StreamSink.put_many`` (records.encode, PutRecords of up to 500 records) against
``MessagesStore.put_many`` (items marshalled, BatchWriteItem of 25), both through the
worker's own clients (:class:`wsfleet.aws.Aws`: no client-side validation, one attempt),
against the emulator in a process of its own so that only the client's CPU is counted
(``time.thread_time`` of the calling thread: what a pool thread of the worker spends).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from wsfleet import records
from wsfleet.aws import Aws
from wsfleet.config import WorkerConfig
from sim.emulator import create_resources
from sim.children import EmulatorProcess
from wsfleet.sinks import MessagesStore, StreamSink
from wsfleet.stream import Frame


def _frames(n: int, size: int, start: int) -> list[tuple[str, int, Frame]]:
    """n frames of about ``size`` bytes of data, spread over 50 connections."""
    pad = "x" * max(0, size - 40)
    out = []
    for i in range(n):
        data = json.dumps({"i": start + i, "p": pad, "t": 1_700_000_000}, separators=(",", ":"))
        out.append((f"conn-{i % 50:03d}", 3, Frame(start + i, data, 1_700_000_000_000 + i, data_bytes=len(data))))
    return out


def _cpu_per_message(put: Callable[[list], None], frames: int, size: int, rounds: int) -> list[float]:
    """CPU ms per message of ``put`` over ``rounds`` calls of ``frames`` fresh frames (one
    warm-up call first: clients, connections and caches)."""
    put(_frames(frames, size, 1))
    out = []
    for r in range(rounds):
        batch = _frames(frames, size, (r + 1) * frames + 1)
        t0 = time.thread_time()
        put(batch)
        out.append((time.thread_time() - t0) * 1000 / frames)
    return out


def run(frames: int = 500, size: int = 200, rounds: int = 20) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, EmulatorProcess(Path(tmp) / "emulator.log") as emu:
        env = create_resources(emu.endpoint_url, sink="dynamodb,kinesis", stream_shards=4)
        cfg = WorkerConfig.from_env(env)
        aws = Aws(cfg, threads=1)
        try:
            table = MessagesStore(aws.dynamodb_writes, cfg.messages_table_name)
            stream = StreamSink(aws.kinesis, cfg.messages_stream_name)
            sample = _frames(frames, size, 1)
            t0 = time.thread_time()
            for _ in range(rounds):
                for c, fence, f in sample:
                    records.encode(c, fence, "w-1", f)
            encode_ms = (time.thread_time() - t0) * 1000 / (rounds * frames)
            before = dict(aws.requests)
            kinesis = _cpu_per_message(lambda b: stream.put_many(b, worker_id="w-1"), frames, size, rounds)
            mid = dict(aws.requests)
            dynamodb = _cpu_per_message(lambda b: table.put_many(b, worker_id="w-1"), frames, size, rounds)
            after = dict(aws.requests)
        finally:
            aws.close()
    sent = (rounds + 1) * frames

    def requests(a: dict, b: dict) -> float:
        return sum(b.values()) - sum(a.values())

    return {
        "frames_per_call": frames,
        "data_bytes": size,
        "rounds": rounds,
        "records_encode_ms_per_message": round(encode_ms, 4),
        "kinesis_ms_per_message": {"median": round(statistics.median(kinesis), 4), "min": round(min(kinesis), 4)},
        "dynamodb_ms_per_message": {"median": round(statistics.median(dynamodb), 4), "min": round(min(dynamodb), 4)},
        "kinesis_requests_per_message": round(requests(before, mid) / sent, 4),
        "dynamodb_requests_per_message": round(requests(mid, after) / sent, 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.sink_cpu", description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=500)
    p.add_argument("--bytes", type=int, default=200)
    p.add_argument("--rounds", type=int, default=20)
    a = p.parse_args()
    print(json.dumps(run(a.frames, a.bytes, a.rounds), indent=2))


if __name__ == "__main__":
    main()
