"""The types of the CLI's arguments: each turns a word of the command line into a value, or
into argparse's one-line error naming what it wanted (``--rate abc: must be a number of
messages per second``), never an internal name or a traceback."""

from __future__ import annotations

import argparse

from .. import settings_spec
from ..stream import MAX_SEQ
from . import records as stream_records


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None


def _positive(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _number(text: str, unit: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of {unit}, got {text!r}") from None


def _zero_or_more(text: str, unit: str) -> float:
    value = _number(text, unit)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text!r}")
    return value


def _rate(text: str) -> float:
    return _zero_or_more(text, "messages per second")


def _count(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {value}")
    return value


def _per_hour(text: str) -> float:
    return _zero_or_more(text, "times per hour")


def _seq(text: str) -> int:
    value = _int(text)
    if not 0 <= value <= MAX_SEQ:
        raise argparse.ArgumentTypeError(f"must be a seq from 0 to {MAX_SEQ}, got {value}")
    return value


def _since(text: str) -> float | None:
    try:
        return stream_records.since_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _retention_hours(text: str) -> float:
    value = _number(text, "hours")
    if not 24 <= value <= 8760:
        raise argparse.ArgumentTypeError(f"must be from 24 to 8760 hours (a Kinesis stream's retention), got {text!r}")
    return value


_FLUSH = settings_spec.VARIABLES[settings_spec.FLUSH_INTERVAL_MS]


def _flush_ms(text: str) -> int:
    value, low, high = _number(text, "milliseconds"), _FLUSH.low, _FLUSH.high
    if not (low <= value <= high and value.is_integer()):
        raise argparse.ArgumentTypeError(f"must be a whole number from {low} to {high} (FLUSH_INTERVAL_MS's bounds), got {text!r}")
    return int(value)


def _ratio(text: str) -> float:
    value = _number(text, "times")
    if not 1 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 1 or more (what GZIP leaves is not larger than what it was given), got {text!r}")
    return value


def _seconds(text: str) -> float:
    value = _number(text, "seconds")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return value


def _quota(text: str) -> tuple[str, float]:
    from ..plan.limits import DEFAULT_QUOTAS

    name, sep, value = text.partition("=")
    if not sep or name.strip() not in DEFAULT_QUOTAS:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE with NAME one of {', '.join(DEFAULT_QUOTAS)}, got {text!r}")
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not number > 0 or number != number or number == float("inf"):
        raise argparse.ArgumentTypeError(f"{name.strip()}: expected a positive number, got {value!r}")
    return name.strip(), number
