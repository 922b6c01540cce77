"""The START ``upstream`` keys about which frames count (:mod:`wsfleet.upstream_spec`
declares the object): ``ignore`` rules, and ``max_silence_seconds``. No I/O.
"""

from __future__ import annotations

from typing import Any

from .pointer import Pointer, PointerError, canonical
from .upstream_secrets import fail

def pointer_of(key: str, value: object) -> Pointer:
    """``value`` as a JSON Pointer, else a 400 naming the key."""
    try:
        return Pointer.parse(value)
    except PointerError as exc:
        raise fail(key, str(exc)) from None


MAX_IGNORE_RULES = 16
MAX_IGNORE_VALUE = 1024  # characters of a rule's value as JSON
MAX_SILENCE_SECONDS = 86_400


def check_ignore(value: object, ctx: Any) -> tuple[tuple[Pointer, str], ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_IGNORE_RULES:
        raise fail("ignore", f'must be a list of 1 to {MAX_IGNORE_RULES} rules {{"pointer", "equals"}}.')
    rules = []
    for rule in value:
        if not isinstance(rule, dict) or set(rule) != {"pointer", "equals"}:
            raise fail("ignore", 'each rule is an object with exactly "pointer" and "equals".')
        pointer = pointer_of("ignore", rule["pointer"])
        if pointer.is_whole:
            raise fail("ignore", "a rule's pointer must point into the frame, not be the whole frame.")
        try:
            equals = canonical(rule["equals"])
        except ValueError:
            raise fail("ignore", "a rule's value must be JSON (no NaN or Infinity).") from None
        if len(equals) > MAX_IGNORE_VALUE:
            raise fail("ignore", f"a rule's value must be at most {MAX_IGNORE_VALUE} characters as JSON.")
        rules.append((pointer, equals))
    return tuple(rules)


def check_silence(value: object, ctx: Any) -> int:
    if isinstance(value, str) and value.isdigit():  # from the CLI's flag
        value = int(value)
    if type(value) is not int or not 1 <= value <= MAX_SILENCE_SECONDS:
        raise fail("max_silence_seconds", f"must be a whole number of seconds from 1 to {MAX_SILENCE_SECONDS}.")
    return value
