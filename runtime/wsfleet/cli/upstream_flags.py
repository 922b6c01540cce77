"""``wsfleet start``'s upstream flags, built from the one declaration of the START
``upstream`` object (:data:`wsfleet.upstream_spec.FIELDS`): a key of type object takes
``NAME=VALUE`` and may be repeated, a repeatable one appends to a list, the rest take
one value (``choices`` where the key has them). Only the syntax of a flag is checked
here; what the values mean is the API's to judge (its 400 is shown as any error is),
because only the router knows its ``UPSTREAM_SECRET_PREFIX``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..upstream_spec import FIELDS, Field
from .errors import CliError

OBJECT = "object"  # Field.type of the keys that map header names to values


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "upstream",
        "the START's optional upstream object (docs/api.md: \"The upstream object\"); without these flags the "
        "default protocol: from_seq in the URL, frames {\"seq\", \"data\"}",
    )
    for f in FIELDS:
        kwargs: dict[str, Any] = {
            "dest": f.key,
            "metavar": f.metavar,
            "help": (f.help + (" Give the flag once per entry." if f.repeat else "")).replace("%", "%%"),
        }
        if f.type == OBJECT:
            kwargs["type"] = _pair(f)
        if f.repeat:
            kwargs["action"] = "append"
        if f.choices:
            kwargs.update(choices=f.choices, metavar="|".join(f.choices))
        group.add_argument(f.flag, **kwargs)


def _pair(f: Field) -> Any:
    def parse(text: str) -> tuple[str, str]:
        name, sep, value = text.partition("=")
        if not sep:
            # The text is not repeated: a --secret-header given a secret by mistake stays out of the terminal log.
            raise argparse.ArgumentTypeError(f"must be {f.metavar}, with '=' after the header name")
        return name, value

    return parse


def upstream_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``upstream`` object the flags given describe; None when none was given."""
    upstream: dict[str, Any] = {}
    for f in FIELDS:
        value = getattr(args, f.key, None)
        if value is None:
            continue
        if f.type == OBJECT:
            seen: dict[str, str] = {}
            for name, _ in value:
                if name.lower() in seen:
                    raise CliError(f"{f.flag} names the header {name} twice (header names are case-insensitive)")
                seen[name.lower()] = name
            value = dict(value)
        if f.key == IGNORE:
            value = [_ignore_rule(f, text) for text in value]
        upstream[f.key] = value
    return upstream or None


IGNORE = "ignore"


def _ignore_rule(f: Field, text: str) -> dict[str, Any]:
    """``POINTER=JSON`` as an ignore rule; a value that is not JSON is the string itself
    (``/type=heartbeat`` and ``/type="heartbeat"`` say the same)."""
    pointer, sep, raw = text.partition("=")
    if not sep:
        raise CliError(f"{f.flag} {text!r}: must be {f.metavar}, e.g. /type=heartbeat")
    try:
        equals = json.loads(raw)
    except ValueError:
        equals = raw
    return {"pointer": pointer, "equals": equals}
