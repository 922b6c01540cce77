"""A local HTTP egress proxy (``CONNECT`` only), for runs and tests of ``UPSTREAM_PROXY``:
it opens the tunnel each ``CONNECT`` asks for and pipes bytes both ways, records the
targets it was asked for, and answers ``refuse`` (an HTTP status) instead when set, as a
proxy's policy would."""

from __future__ import annotations

import asyncio
import contextlib


class EgressProxy:
    def __init__(self) -> None:
        self.targets: list[str] = []  # what each CONNECT asked for, in order
        self.authorizations: list[str | None] = []  # each CONNECT's Proxy-Authorization
        self.refuse: int | None = None  # answer CONNECT with this status instead
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> "EgressProxy":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            auth = next((v.strip() for k, _, v in (line.partition(":") for line in lines[1:]) if k.lower() == "proxy-authorization"), None)
            self.targets.append(target)
            self.authorizations.append(auth)
            if method != "CONNECT" or self.refuse is not None:
                writer.write(f"HTTP/1.1 {self.refuse or 405} Refused\r\nContent-Length: 0\r\n\r\n".encode())
                await writer.drain()
                return
            host, _, port = target.rpartition(":")
            up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while chunk := await src.read(65536):
                    dst.write(chunk)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
