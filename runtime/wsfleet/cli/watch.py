"""``wsfleet status --watch``: the fleet read again every interval. On a terminal the
picture is redrawn in place (cursor home, each line cleared to its end, the rest of the
screen cleared below); anywhere else (a pipe, a file, CI) one snapshot follows another,
stamped, with no escape codes. Ctrl-C ends it with status 0. Also the fleet's alarms in
ALARM state, which ``status`` shows when it knows the stack (``--stack``)."""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any, Callable, TextIO

from botocore.exceptions import BotoCoreError, ClientError

from ..store import TransientError
from .errors import aws_sentence

HOME, CLEAR_SCREEN, CLEAR_LINE, CLEAR_BELOW = "\x1b[H", "\x1b[2J", "\x1b[K", "\x1b[J"
STACK_SUFFIXES = ("-stateful", "-service")


def alarm_prefix(stack_name: str) -> str:
    """The stacks name their alarms ``wsfleet-<env>-...``; their stacks are
    ``wsfleet-<env>-stateful`` and ``wsfleet-<env>-service``."""
    for suffix in STACK_SUFFIXES:
        if stack_name.endswith(suffix):
            return stack_name[: -len(suffix)] + "-"
    return stack_name + "-"


def firing(cloudwatch: Any, prefix: str) -> dict[str, Any]:
    """The alarms named ``prefix...`` in ALARM state (name, since, reason), or why they
    could not be read: a watch goes on without them rather than stop."""
    try:
        pages = cloudwatch.get_paginator("describe_alarms").paginate(AlarmNamePrefix=prefix, StateValue="ALARM")
        alarms = [
            {"name": a["AlarmName"], "since": str(a.get("StateUpdatedTimestamp", "")), "reason": a.get("StateReason", "")}
            for page in pages
            for a in page.get("MetricAlarms", []) + page.get("CompositeAlarms", [])
        ]
    except (BotoCoreError, ClientError) as error:
        return {"prefix": prefix, "firing": None, "error": aws_sentence(error)}
    return {"prefix": prefix, "firing": sorted(alarms, key=lambda a: a["name"])}


def run(snapshot: Callable[[], str], *, interval: float, out: TextIO, tty: bool, lines: bool = False,
        sleep: Callable[[float], None] | None = None, now: Callable[[], float] = time.time) -> int:
    """Print ``snapshot()`` every ``interval`` seconds until Ctrl-C; returns 0. A read that
    fails (a throttle, a network blip) is shown in its place and the watch goes on.
    ``lines``: each snapshot is one line for a script (JSON Lines): no stamp, no blank."""
    first = True
    try:
        while True:
            stamp = dt.datetime.fromtimestamp(now(), dt.timezone.utc).strftime("%H:%M:%S UTC")
            try:
                text = snapshot()
            except (BotoCoreError, ClientError, TransientError) as error:
                sentence = aws_sentence(error)
                text = json.dumps({"error": sentence}) if lines else f"read failed: {sentence}; trying again in {interval:g}s"
            head = f"wsfleet status at {stamp}, every {interval:g}s (Ctrl-C to stop)"
            if lines:
                out.write(text + "\n")
            elif tty:
                body = "\n".join(line + CLEAR_LINE for line in [head, "", *text.splitlines()])
                out.write((CLEAR_SCREEN if first else "") + HOME + body + "\n" + CLEAR_BELOW)
                first = False
            else:
                out.write(f"{head}\n{text}\n\n")
            out.flush()
            (sleep or time.sleep)(interval)
    except KeyboardInterrupt:
        if tty and not lines:
            out.write("\n")
            out.flush()
        return 0
