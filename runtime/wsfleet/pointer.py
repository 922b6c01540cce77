"""JSON Pointers (RFC 6901): where an upstream frame keeps its seq and its data. No I/O.

A pointer is ``""`` (the whole document) or ``/``-separated reference tokens, each with
``~1`` for ``/`` and ``~0`` for ``~``. Against an object a token is a member name;
against an array it is an index written in decimal without leading zeros (``-``, the
element after the last, never resolves to a value). :meth:`Pointer.resolve` never
raises: a pointer that does not lead to a value answers :data:`MISSING`.
"""

from __future__ import annotations

import json

import re
from dataclasses import dataclass
from typing import Any

MAX_POINTER_LENGTH = 256
MAX_POINTER_TOKENS = 32
_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]{0,17}")  # decimal, no leading zero, below 10^18
_BAD_ESCAPE = re.compile(r"~(?![01])")


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()  # what resolve() answers when the pointer leads nowhere


class PointerError(ValueError):
    """Not a JSON Pointer; the message says why in a sentence."""


@dataclass(frozen=True)
class Pointer:
    """A parsed JSON Pointer. ``text`` is as written; ``tokens`` the unescaped tokens."""

    text: str
    tokens: tuple[str, ...]

    @classmethod
    def parse(cls, text: object) -> "Pointer":
        if not isinstance(text, str):
            raise PointerError("a JSON Pointer must be a string.")
        if len(text) > MAX_POINTER_LENGTH:
            raise PointerError(f"a JSON Pointer must be at most {MAX_POINTER_LENGTH} characters.")
        if text == "":
            return cls("", ())
        if not text.startswith("/"):
            raise PointerError(f"JSON Pointer {text!r} must be empty or start with '/'.")
        if _BAD_ESCAPE.search(text):
            raise PointerError(
                f"JSON Pointer {text!r} has a '~' not followed by 0 or 1 (write ~0 for '~', ~1 for '/')."
            )
        raw = text[1:].split("/")
        if len(raw) > MAX_POINTER_TOKENS:
            raise PointerError(f"a JSON Pointer must have at most {MAX_POINTER_TOKENS} tokens.")
        return cls(text, tuple(t.replace("~1", "/").replace("~0", "~") for t in raw))

    @property
    def is_whole(self) -> bool:
        """The pointer ``""``: the whole document."""
        return not self.tokens

    def resolve(self, document: Any) -> Any:
        """The value the pointer leads to in a parsed JSON document, or MISSING."""
        value = document
        for token in self.tokens:
            if type(value) is dict:
                if token not in value:
                    return MISSING
                value = value[token]
            elif type(value) is list:
                if not _ARRAY_INDEX.fullmatch(token) or int(token) >= len(value):
                    return MISSING
                value = value[int(token)]
            else:
                return MISSING
        return value

    def __str__(self) -> str:
        return self.text


def canonical(value: object) -> str:
    """A JSON value as one text whatever its key order: what an ignore rule compares."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def ignored(obj: object, rules: tuple[tuple[Pointer, str], ...]) -> bool:
    """Whether any rule (a pointer, and a value as :func:`canonical` text) holds in ``obj``:
    its pointer leads to its value (an upstream's ``ignore`` rules: heartbeats, acks)."""
    for pointer, equals in rules:
        value = pointer.resolve(obj)
        if value is not MISSING and canonical(value) == equals:
            return True
    return False
