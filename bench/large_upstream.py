"""An upstream that sends frames of one size back to back, for the large-frames benchmark.

``python -m bench.large_upstream --frame-bytes N [--port 0]`` prints ``READY ws://...``.
Each socket (``/streams/<name>?from_seq=K``) gets text frames
``{"seq": K, "data": "xxxx..."}``, K, K+1, ..., each exactly ``--frame-bytes`` long or
a few bytes under, as fast as the client reads them: TCP back-pressure is the only pace.

The local upstream (sim.upstream) keeps every frame it produced for replay;
with frames at the 32 MiB limit on every stream that is gigabytes. This one builds the
frames lazily from one shared filler: its memory does not grow with the sockets or the
frames sent, so the worker's figures are not the upstream's. It is a plain threaded
server: one thread per socket sends (the payload written from the shared buffer, no copy
per frame), another reads and discards what the client sends (pings, the close frame).
It answers no ping: the worker counts bytes arriving as the peer being alive.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import socket
import struct
import sys
import threading
from urllib.parse import parse_qs, urlsplit

ACCEPT_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3
PREFIX_RESERVED = 40  # '{"seq":' + up to 20 digits + ',"data":"' and '"}'


def handshake_response(key: bytes) -> bytes:
    accept = base64.b64encode(hashlib.sha1(key + ACCEPT_GUID).digest())
    return (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")


class LargeFrameUpstream:
    def __init__(self, frame_bytes: int, host: str = "127.0.0.1", port: int = 0) -> None:
        if frame_bytes <= PREFIX_RESERVED:
            raise ValueError(f"frame_bytes must be over {PREFIX_RESERVED}")
        self.filler = memoryview(b"x" * (frame_bytes - PREFIX_RESERVED))
        self.server = socket.create_server((host, port))
        self.url = f"ws://{host}:{self.server.getsockname()[1]}"
        self.frames_sent = 0
        self._lock = threading.Lock()

    def serve_forever(self) -> None:
        while True:
            conn, _ = self.server.accept()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(4096)
                if not chunk or len(request) > 16384:
                    return
                request += chunk
            head = request.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
            path = head[0].split(b" ")[1].decode()
            key = next(line.split(b":", 1)[1].strip() for line in head[1:] if line.lower().startswith(b"sec-websocket-key:"))
            seq = int(parse_qs(urlsplit(path).query).get("from_seq", ["1"])[0])
            conn.sendall(handshake_response(key))
            threading.Thread(target=self._discard, args=(conn,), daemon=True).start()
            while True:
                prefix = b'{"seq":%d,"data":"' % seq
                size = len(prefix) + len(self.filler) + 2
                conn.sendall(struct.pack("!BBQ", 0x81, 127, size) + prefix)
                conn.sendall(self.filler)
                conn.sendall(b'"}')
                seq += 1
                with self._lock:
                    self.frames_sent += 1
        except (OSError, StopIteration, ValueError, IndexError):
            pass
        finally:
            conn.close()

    @staticmethod
    def _discard(conn: socket.socket) -> None:
        try:
            while conn.recv(65536):
                pass
        except OSError:
            pass
        try:
            conn.shutdown(socket.SHUT_RDWR)  # the client closed: stop the sender too
        except OSError:
            pass


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.large_upstream", description=__doc__.splitlines()[0])
    p.add_argument("--frame-bytes", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    upstream = LargeFrameUpstream(args.frame_bytes, args.host, args.port)
    print(f"READY {upstream.url}", flush=True)
    try:
        upstream.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
