"""Read API: how long ``GET /connections/{id}/messages`` takes for a page, as a caller sees it.

One emulator process holds a connection's stored messages (written through the worker's
own store code: inline items, S3 objects with their pointer items, and skip markers); the
event router answers behind the local API Gateway stand-in on loopback, in this process,
and a client times whole HTTP requests (connect, the router's Query, presigning, the JSON
body). Pages:

* 100 inline entries of about 1 KB (the default page);
* 100 entries of which 10 are large data (each a presigned ``data_url``; presigning sends
  no request);
* 1,000 inline entries (the largest page by count);
* entries of 300 KB: the page is cut by bytes (4 MB of response), not by count;

and, for the large entries, the time to fetch one 8 MiB ``data_url`` from the emulator's S3.
moto answers the Query, not DynamoDB: the figures compare page shapes in one run; they are
not what a deployed API answers (API Gateway, Lambda and DynamoDB add and remove their
own latencies).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

from wsfleet import config as cfg
from wsfleet import settings_spec
from sim.api import LocalApi
from sim.processes import LOOPBACK
from wsfleet.logs import JsonLogger
from wsfleet.router import Router, make_presigner
from wsfleet.sinks import MessagesStore, ObjectsStore
from wsfleet.stream import Frame

from .common import Result, Rig, distribution, fmt, md_table


def settings_for(quick: bool) -> dict[str, Any]:
    return {
        "requests_per_page": 3 if quick else 30,
        "inline_bytes": 1000,
        "inline_messages": 150 if quick else 1200,  # enough for a page of 1,000 after the first 100
        "large_messages": 10,
        "large_bytes": 400_000 if quick else (8 << 20),  # over an item: an S3 object either way
        "big_inline_messages": 2 if quick else 30,
        "big_inline_bytes": 300_000,
    }


def _data(n: int, seq: int) -> str:
    return json.dumps({"seq_was": seq, "text": "x" * n}, separators=(",", ":"))


def _timed(n: int, fn: Callable[[], Any]) -> tuple[list[float], Any]:
    times, last = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        last = fn()
        times.append(time.perf_counter() - t0)
    return times, last


def _ms(d: dict[str, Any]) -> list[str]:
    """The p50, p90 and max cells (ms) of a distribution of seconds."""
    return [fmt(d[k] * 1000, 0) for k in ("p50", "p90", "max")]


def run(*, quick: bool, run_dir: Path, command: str) -> Result:
    s = settings_for(quick)
    with Rig(run_dir / "readapi") as rig:
        s3 = rig.session.client("s3", endpoint_url=rig.emulator.endpoint_url)
        messages = MessagesStore(rig.ddb, rig.aws_env["MESSAGES_TABLE_NAME"])
        objects = ObjectsStore(s3, rig.aws_env["MESSAGES_BUCKET_NAME"])
        now = int(time.time() * 1000)
        # "inline": 1 KB items; "mixed": every tenth of its first 100 is large data;
        # "big": 300 KB items.
        for cid in ("inline", "mixed", "big"):
            rig.connections.start(cid, f"ws://{LOOPBACK}:1/{cid}")
        messages.put_many(
            [("inline", 1, Frame(seq, _data(s["inline_bytes"], seq), now)) for seq in range(1, s["inline_messages"] + 1)],
            worker_id="bench",
        )
        stored, mixed = {}, []
        for seq in range(1, 101):
            large = seq % 10 == 5
            data = _data(s["large_bytes"] if large else s["inline_bytes"], seq)
            frame = Frame(seq, data, now, data_bytes=len(data.encode()))
            if large:
                stored[("mixed", seq)] = objects.put("mixed", seq, data)
            mixed.append(("mixed", 1, frame))
        messages.put_many(mixed, worker_id="bench", objects=stored)
        messages.put_many(
            [("big", 1, Frame(seq, _data(s["big_inline_bytes"], seq), now)) for seq in range(1, s["big_inline_messages"] + 1)],
            worker_id="bench",
        )

        env = {**rig.aws_env, settings_spec.ALLOWED_WS_HOSTS: LOOPBACK}
        with open(run_dir / "readapi" / "router.log", "a", buffering=1) as log:
            router = Router.from_env(
                env, ddb=rig.ddb, sqs=rig.sqs, s3=make_presigner(cfg.RouterConfig.from_env(env), session=rig.session),
                logger=JsonLogger(log, component="router"),
            )
            with LocalApi(router.handle, LOOPBACK, 0) as api:

                def get(path: str) -> tuple[int, dict]:
                    with urllib.request.urlopen(api.url + path, timeout=60) as resp:
                        body = resp.read()
                        return len(body), json.loads(body)

                n = s["requests_per_page"]
                pages = [
                    ("100 inline entries of ~1 KB", "/connections/inline/messages?after_seq=0&limit=100"),
                    (f"100 entries, {s['large_messages']} of them data_url", "/connections/mixed/messages?after_seq=0&limit=100"),
                    ("1,000 inline entries of ~1 KB", "/connections/inline/messages?after_seq=100&limit=1000"),
                    ("300 KB entries: cut by bytes", "/connections/big/messages?after_seq=0&limit=1000"),
                ]
                rows, raw = [], {}
                for label, path in pages:
                    get(path)  # a first request outside the sample (connection set-up, imports)
                    times, (size, body) = _timed(n, lambda p=path: get(p))
                    d = distribution(times)
                    raw[label] = {"path": path, "bytes": size, "entries": len(body["messages"]), "seconds": d}
                    rows.append([label, len(body["messages"]), f"{size / 1e6:.2f}", *_ms(d)])
                _, body = get("/connections/mixed/messages?after_seq=0&limit=100")
                url = next(e["data_url"] for e in body["messages"] if "data_url" in e)

                def fetch() -> int:
                    with urllib.request.urlopen(url, timeout=60) as resp:
                        return len(resp.read())

                times, size = _timed(n, fetch)
                d = distribution(times)
                raw["data_url fetch"] = {"bytes": size, "seconds": d}
                rows.append([f"one data_url ({size / 2**20:g} MiB object)", 1, f"{size / 1e6:.2f}", *_ms(d)])

    table = md_table(["request", "entries", "response MB", "p50 ms", "p90 ms", "max ms"], rows)
    notes = [
        f"{n} requests of each, one after another, through the local API on loopback to the router in the "
        "benchmark's process; the emulator (moto) answers the Query and serves the object",
        "a page is cut at 4 MB of response (as Lambda counts it) whatever the limit: the 300 KB row shows the "
        "entries one page holds",
    ]
    return Result("readapi", command, s, table, {"pages": raw}, notes)
