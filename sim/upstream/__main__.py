"""``python -m sim.upstream``: the local upstream as a process; prints
``READY ws://HOST:PORT`` once it listens, stops on SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal

from wsfleet.logs import route_stdlib_logging
from .server import Upstream


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sim.upstream", description="A local WebSocket upstream: many numbered streams on one server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--rate", type=float, default=2.0, help="frames per second per stream; 0 for none")
    parser.add_argument("--history", type=int, default=None, help="frames retained per stream [all]")
    parser.add_argument(
        "--credential", action="append", default=[], metavar="VALUE",
        help="a value accepted in the header an auth_header= stream URL names (repeatable)",
    )
    args = parser.parse_args(argv)
    route_stdlib_logging(component="upstream")

    async def run() -> None:
        upstream = Upstream(host=args.host, port=args.port, rate=args.rate or None, history=args.history,
                            credentials=args.credential)
        await upstream.start()
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        print(f"READY {upstream.url}", flush=True)
        await stop.wait()
        await upstream.stop()

    asyncio.run(run())


if __name__ == "__main__":
    main()
