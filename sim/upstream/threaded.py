"""The local upstream for synchronous callers: its own event loop in a daemon thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Iterable, TypeVar

from .books import Overlap, SocketRecord, StreamTotals
from .kinds import DEFAULT
from .server import NOT_JSON, Upstream

T = TypeVar("T")


class ThreadedUpstream:
    """An :class:`Upstream` running its own event loop in a daemon thread, for
    synchronous callers. Every method runs on that loop and returns a copy."""

    def __init__(self, **settings: Any) -> None:
        self._settings = settings
        self._loop: asyncio.AbstractEventLoop | None = None
        self._upstream: Upstream | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    def start(self, timeout: float = 10.0) -> "ThreadedUpstream":
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(ready),), name="upstream", daemon=True)
        self._thread.start()
        ready.result(timeout)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        assert self._loop is not None and self._stopped is not None
        self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(timeout)
        self._thread = None

    def __enter__(self) -> "ThreadedUpstream":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _main(self, ready: concurrent.futures.Future[None]) -> None:
        try:
            self._loop = asyncio.get_running_loop()
            self._stopped = asyncio.Event()
            self._upstream = await Upstream(**self._settings).start()
        except BaseException as error:
            ready.set_exception(error)
            return
        ready.set_result(None)
        try:
            await self._stopped.wait()
        finally:
            await self._upstream.stop()

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._loop is None or self._thread is None:
            raise RuntimeError("the upstream is not started")
        result: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                result.set_result(fn(*args, **kwargs))
            except BaseException as error:
                result.set_exception(error)

        self._loop.call_soon_threadsafe(run)
        return result.result(timeout=30)

    @property
    def upstream(self) -> Upstream:
        """The wrapped upstream; touch it only from its own loop (see :meth:`_call`)."""
        assert self._upstream is not None
        return self._upstream

    @property
    def url(self) -> str:
        return self._call(lambda: self.upstream.url)

    @property
    def stats_url(self) -> str:
        return self._call(lambda: self.upstream.stats_url)

    def url_for(self, stream: str) -> str:
        return self._call(self.upstream.url_for, stream)

    def create_stream(self, stream: str, *, shape: str = DEFAULT) -> None:
        self._call(self.upstream.create_stream, stream, shape=shape)

    def set_credentials(self, credentials: Iterable[str]) -> None:
        self._call(self.upstream.set_credentials, list(credentials))

    def publish(self, stream: str, data: Any = None) -> int:
        return self._call(self.upstream.publish, stream, data)

    def publish_raw(self, stream: str, make: Callable[[int], bytes]) -> int:
        return self._call(self.upstream.publish_raw, stream, make)

    def skip(self, stream: str, count: int) -> int:
        return self._call(self.upstream.skip, stream, count)

    def replay_from(self, stream: str, offset: int) -> None:
        self._call(self.upstream.replay_from, stream, offset)

    def inject(self, stream: str, text: str | bytes = NOT_JSON) -> None:
        self._call(self.upstream.inject, stream, text)

    def drop(self, stream: str, *, abrupt: bool = True) -> int:
        return self._call(self.upstream.drop, stream, abrupt=abrupt)

    def stall(self, stream: str, on: bool = True) -> int:
        return self._call(self.upstream.stall, stream, on)

    def slow(self, stream: str, delay_s: float = 0.0) -> None:
        self._call(self.upstream.slow, stream, delay_s)

    def oversize(self, stream: str, size: int) -> int:
        return self._call(self.upstream.oversize, stream, size)

    def streams(self) -> list[str]:
        return self._call(self.upstream.streams)

    def produced(self, stream: str) -> int:
        return self._call(self.upstream.produced, stream)

    def frames(self, stream: str) -> dict[int, bytes]:
        return self._call(self.upstream.frames, stream)

    def expected_data(self, stream: str) -> dict[int, str | None]:
        return self._call(self.upstream.expected_data, stream)

    def shape(self, stream: str) -> str | None:
        return self._call(self.upstream.shape, stream)

    def refusals(self, stream: str) -> dict[int, int]:
        return self._call(self.upstream.refusals, stream)

    def held_handshakes(self, stream: str) -> tuple[int, int]:
        return self._call(self.upstream.held_handshakes, stream)

    def sockets(self, stream: str) -> list[SocketRecord]:
        return self._call(self.upstream.sockets, stream)

    def open_sockets(self, stream: str) -> list[SocketRecord]:
        return self._call(self.upstream.open_sockets, stream)

    def max_concurrent(self, stream: str) -> int:
        return self._call(self.upstream.max_concurrent, stream)

    def overlaps(self, stream: str | None = None) -> list[Overlap]:
        return self._call(self.upstream.overlaps, stream)

    def totals(self, stream: str) -> StreamTotals:
        return self._call(self.upstream.totals, stream)

    def stats(self) -> dict[str, Any]:
        return self._call(self.upstream.stats)
