"""Pauses: how often a writer frozen by SIGSTOP still lands a message batch after its deadline.

Message writes (BatchWriteItem) are not conditional: what stops a frozen worker from
writing after its session ran out is its own deadline check, made as late as the request
allows (:func:`wsfleet.aws.send_deadline`). A request that has passed the last check when
the freeze hits goes out as the process wakes, after a successor may have taken over:
the same frames (a replay stores the same data under the same keys), with an older fence.
This measures how often that happens, with the check as it is and with the botocore
``before-send`` check alone (what the worker had before the socket check), in one run.

The writer is a child process running the worker's own write path, six threads each
sending 25-frame batches through :class:`wsfleet.store.MessagesStore` on the worker's
message client under ``send_deadline``, plus a thread that keeps the GIL busy the way the
event loop does. Its "session" is renewed every 50 ms to a 200 ms deadline; a renewal that
finds itself late by more than the deadline stops renewing for 400 ms (the session is lost).
The parent freezes it for 0.5 s at random moments, again and again, and reads the
emulator's journal: every batch applied later than 250 ms after a freeze began (past any
deadline the writer held) and before its renewals resume landed after its deadline.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sim.children import child_env
from sim.emulator import Emulator, create_resources, journal, record_journal

from .common import Result, md_table

DEADLINE_S = 0.2  # the fake session's lease: each renewal moves the deadline this far ahead
RENEW_S = 0.05
QUIET_S = 0.4  # after a freeze, no renewal for this long: every write in it is past its deadline
FREEZE_S = 0.5
WRITERS = 6
CHECKS = {"socket": "before-send and socket (as shipped)", "before-send": "before-send only (before this check)"}


def settings_for(quick: bool) -> dict[str, Any]:
    return {"pauses": 4 if quick else 300, "freeze_s": FREEZE_S, "deadline_s": DEADLINE_S, "writers": WRITERS,
            "seed": random.SystemRandom().getrandbits(32)}


def run(*, quick: bool, run_dir: Path, command: str) -> Result:
    p = settings_for(quick)
    rng = random.Random(p["seed"])
    print(f"    seed {p['seed']}", flush=True)
    emulator = Emulator().start()
    try:
        rows = {check: _freeze_again_and_again(emulator.endpoint_url, check, p["pauses"], rng, run_dir) for check in CHECKS}
    finally:
        emulator.stop()
    header = ["deadline check", "freezes", "batches written", "freezes followed by a late batch", "late batches"]
    table = md_table(header, [
        [CHECKS[c], r["pauses"], r["batches"], f"{r['pauses_late']} ({100 * r['pauses_late'] / r['pauses']:.1f} %)", r["late_batches"]]
        for c, r in rows.items()
    ])
    notes = [
        "a late batch carries frames received before the freeze (the same data its successor stores); "
        "the chaos checker excuses exactly these (sim.chaos.checker.in_flight_at_freeze)",
        f"{WRITERS} writer threads, 25 frames per batch, a {DEADLINE_S:g} s deadline renewed every {RENEW_S:g} s, "
        f"{FREEZE_S:g} s freezes; seed {p['seed']}",
    ]
    return Result("pauses", command, p, table, {"rows": rows}, notes)


def _freeze_again_and_again(endpoint_url: str, check: str, pauses: int, rng: random.Random, run_dir: Path) -> dict[str, Any]:
    env = create_resources(endpoint_url, table_name=f"pauses-c-{check}", sessions_table_name=f"pauses-s-{check}",
                           messages_table_name=f"pauses-m-{check}", messages_bucket_name=f"pauses-m-{check}", queue_name=f"pauses-q-{check}")
    with open(run_dir / f"pauses-{check}.log", "w") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.pauses", json.dumps(env), check],
            env=child_env(**env), stdout=subprocess.PIPE, stderr=log, text=True,
        )
        try:
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the writer did not start: see {log.name}")
            record_journal(endpoint_url)
            time.sleep(1.0)
            windows = []
            for _ in range(pauses):
                time.sleep(rng.uniform(0.3, 0.6))
                stopped = time.time()
                os.kill(child.pid, signal.SIGSTOP)
                time.sleep(FREEZE_S)
                resumed = time.time()
                os.kill(child.pid, signal.SIGCONT)
                # Past every deadline the writer held at the freeze, until its renewals resume.
                windows.append((stopped + DEADLINE_S + 0.05, resumed + QUIET_S - 0.1))
            time.sleep(QUIET_S)
        finally:
            child.kill()
            child.wait()
    table = env["MESSAGES_TABLE_NAME"]
    batches = sorted({(e["t_ms"], e["worker"]) for e in journal(endpoint_url) if e.get("op") == "put" and e.get("table") == table})
    record_journal(endpoint_url, record=False)
    late = [t / 1000 for t, _ in batches if any(a <= t / 1000 <= b for a, b in windows)]
    return {
        "pauses": pauses,
        "batches": len(batches),
        "late_batches": len(late),
        "pauses_late": sum(1 for a, b in windows if any(a <= t <= b for t in late)),
    }


# --- the writer (the child process) ------------------------------------------------------------


def _writer_process(env: dict[str, str], check: str) -> None:
    from wsfleet import aws as aws_module
    from wsfleet.config import WorkerConfig
    from wsfleet.sinks import MessagesStore
    from wsfleet.store import TransientError
    from wsfleet.stream import Frame

    if check == "before-send":
        aws_module._install_socket_check = lambda: None  # the worker as it was: botocore's hook alone
    aws = aws_module.Aws(WorkerConfig.from_env(env), threads=WRITERS)
    messages = MessagesStore(aws.dynamodb_writes, env["MESSAGES_TABLE_NAME"])
    state = {"deadline": time.monotonic() + DEADLINE_S}

    def renew() -> None:
        last, quiet_until = time.monotonic(), 0.0
        while True:
            time.sleep(RENEW_S)
            now = time.monotonic()
            if now - last > DEADLINE_S:  # it was frozen past its deadline: the session is lost
                quiet_until = now + QUIET_S
            last = now
            if now >= quiet_until:
                state["deadline"] = now + DEADLINE_S

    def write(w: int) -> None:
        for n in range(10**9):
            now_ms = int(time.time() * 1000)
            entries = [(f"c{w}", 1, Frame((n % 40) * 25 + i, json.dumps({"i": i}), now_ms)) for i in range(25)]
            try:
                with aws_module.send_deadline(state["deadline"]):
                    messages.put_many(entries, worker_id=f"writer-{w}")
            except TransientError:
                time.sleep(0.005)

    def busy() -> None:  # the event loop's share of the GIL
        while True:
            sum(i * i for i in range(2000))
            time.sleep(0.001)

    for target, args in [(renew, ()), (busy, ()), *((write, (w,)) for w in range(WRITERS))]:
        threading.Thread(target=target, args=args, daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    _writer_process(json.loads(sys.argv[1]), sys.argv[2])
