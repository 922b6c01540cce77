"""JSON-lines logging: one event per line on stdout, with ``event`` and, where they
apply, ``worker_id`` and ``connection_id``."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO


class JsonLogger:
    def __init__(self, stream: TextIO | None = None, **context: Any) -> None:
        self._stream = stream
        self._context = context

    def bind(self, **context: Any) -> "JsonLogger":
        """A logger that adds these fields to every event."""
        return JsonLogger(self._stream, **{**self._context, **context})

    def _emit(self, level: str, event: str, fields: dict[str, Any]) -> None:
        record = {"ts": round(time.time(), 3), "level": level, "event": event, **self._context, **fields}
        line = json.dumps(record, default=str, separators=(",", ":"))
        stream = self._stream or sys.stdout
        try:
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):
            pass  # stdout gone (closed pipe at shutdown): logging must never kill the worker

    def info(self, event: str, **fields: Any) -> None:
        self._emit("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit("error", event, fields)
