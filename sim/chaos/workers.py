"""The worker processes as the nemesis sees them from outside: a clock set off with
libfaketime, the sockets a process holds (from /proc), and the log lines it wrote since
some point (a long run's logs are large: only what is new is read)."""

from __future__ import annotations

import glob
import json
import os
from typing import Any

FAKETIME_LIB = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)


def clock_off_by(offset_ms: int) -> dict[str, str]:
    """Environment that runs a worker with its wall clock ``offset_ms`` off (libfaketime).

    The monotonic clock is shifted by the same constant, which changes no interval the
    worker measures. Leaving it alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``) would be the
    obvious choice, but with it libfaketime 0.9.10 fails every ``time.sleep`` (Python
    sleeps with an absolute CLOCK_MONOTONIC ``clock_nanosleep``) with EINVAL: a worker
    whose botocore retries cannot sleep, which no real clock error causes."""
    if FAKETIME_LIB is None:
        return {}
    return {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": f"{offset_ms / 1000:+.3f}"}


def tcp_peers(pid: int, port: int) -> list[str]:
    """The ``127.0.0.1:<local port>`` of every TCP connection process ``pid`` holds to
    ``port`` on loopback: how the upstream names that process's sockets (from /proc)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        with open(f"/proc/{pid}/net/tcp") as table:
            rows = table.read().splitlines()[1:]
    except OSError:
        return []
    peers = []
    for row in rows:
        parts = row.split()
        local, remote, inode = parts[1], parts[2], parts[9]
        if inode in inodes and int(remote.split(":")[1], 16) == port:
            peers.append(f"127.0.0.1:{int(local.split(':')[1], 16)}")
    return sorted(peers)


def log_size(path: Any) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def log_lines_from(path: Any, offset: int) -> tuple[list[dict], int]:
    """The JSON log lines a worker wrote from byte ``offset`` on, and where the last whole
    line ended (a line still being written is left for the next read)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except OSError:
        return [], offset
    whole = chunk[: chunk.rfind(b"\n") + 1]
    lines = []
    for line in whole.splitlines():
        if line.startswith(b"{"):
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass
    return lines, offset + len(whole)
