"""DynamoDB's expression language, as much of it as the product's store writes: condition
and key-condition expressions (comparisons, AND, OR, NOT, parentheses,
``attribute_exists``, ``attribute_not_exists``, ``size``, ``begins_with``), update
expressions (SET of a value, ``if_not_exists`` and ``+``/``-``; REMOVE; ADD of a number
or a set; DELETE from a set) and projections of top-level attributes.

Each expression is compiled once into Python closures (cached by its text and its name
placeholders) that read plain values: the simulated table keeps items unmarshalled.
Anything outside that subset raises :class:`ExpressionError`, naming it.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, Mapping

Item = dict
Values = Mapping[str, Any]
Condition = Callable[[Item, Values], bool]


class ExpressionError(ValueError):
    """An expression the simulated table does not understand (a ValidationException)."""


_TOKEN = re.compile(r"\s*(<>|<=|>=|[=<>(),+\-]|:[A-Za-z0-9_]+|#[A-Za-z0-9_]+|[A-Za-z_][A-Za-z0-9_.]*)")
_MISSING = object()


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ExpressionError(f"cannot read {text[pos:]!r} in {text!r}")
        out.append(m.group(1))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str, names: Mapping[str, str]) -> None:
        self.text, self.names, self.toks, self.i = text, names, _tokens(text), 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok.upper() != expected):
            raise ExpressionError(f"expected {expected or 'more'} in {self.text!r}, found {tok!r}")
        self.i += 1
        return tok

    def done(self) -> None:
        if self.peek() is not None:
            raise ExpressionError(f"unexpected {self.peek()!r} in {self.text!r}")

    def name(self) -> str:
        tok = self.take()
        if tok.startswith("#"):
            if tok not in self.names:
                raise ExpressionError(f"placeholder {tok} has no ExpressionAttributeNames entry")
            return self.names[tok]
        if tok.startswith(":") or "." in tok:
            raise ExpressionError(f"only top-level attribute names are simulated, not {tok!r}")
        return tok

    # --- conditions ---------------------------------------------------------------------

    def condition(self) -> Condition:
        parts = [self.conjunction()]
        while (self.peek() or "").upper() == "OR":
            self.take()
            parts.append(self.conjunction())
        return parts[0] if len(parts) == 1 else (lambda item, v: any(p(item, v) for p in parts))

    def conjunction(self) -> Condition:
        parts = [self.negation()]
        while (self.peek() or "").upper() == "AND":
            self.take()
            parts.append(self.negation())
        return parts[0] if len(parts) == 1 else (lambda item, v: all(p(item, v) for p in parts))

    def negation(self) -> Condition:
        if (self.peek() or "").upper() == "NOT":
            self.take()
            inner = self.negation()
            return lambda item, v: not inner(item, v)
        return self.primary()

    def primary(self) -> Condition:
        tok = self.peek()
        if tok == "(":
            self.take()
            inner = self.condition()
            self.take(")")
            return inner
        low = (tok or "").lower()
        if low in ("attribute_exists", "attribute_not_exists"):
            self.take()
            self.take("(")
            attr = self.name()
            self.take(")")
            return (lambda item, v: attr in item) if low == "attribute_exists" else (lambda item, v: attr not in item)
        if low == "begins_with":
            self.take()
            self.take("(")
            left = self.operand()
            self.take(",")
            right = self.operand()
            self.take(")")
            return lambda item, v: isinstance(a := left(item, v), str) and isinstance(b := right(item, v), str) and a.startswith(b)
        left = self.operand()
        op = self.take()
        if op.upper() == "BETWEEN":
            low_op = self.operand()
            self.take("AND")
            high_op = self.operand()
            return lambda item, v: _compare("<=", low_op(item, v), left(item, v)) and _compare("<=", left(item, v), high_op(item, v))
        if op not in ("=", "<>", "<", "<=", ">", ">="):
            raise ExpressionError(f"unsupported comparator {op!r} in {self.text!r}")
        right = self.operand()
        return lambda item, v: _compare(op, left(item, v), right(item, v))

    def operand(self) -> Callable[[Item, Values], Any]:
        tok = self.peek()
        if tok is not None and tok.lower() == "size":
            self.take()
            self.take("(")
            attr = self.name()
            self.take(")")
            return lambda item, v: len(item[attr]) if attr in item else _MISSING
        if tok is not None and tok.startswith(":"):
            self.take()
            return lambda item, v: _value(v, tok)
        attr = self.name()
        return lambda item, v: item.get(attr, _MISSING)

    # --- updates --------------------------------------------------------------------------

    def update(self) -> Callable[[Item, Values], None]:
        steps: list[Callable[[Item, Values], None]] = []
        while self.peek() is not None:
            clause = self.take().upper()
            while True:
                steps.append(self.update_action(clause))
                if self.peek() != ",":
                    break
                self.take(",")
        if not steps:
            raise ExpressionError("an empty update expression")

        def apply(item: Item, values: Values) -> None:
            for step in steps:
                step(item, values)

        return apply

    def update_action(self, clause: str) -> Callable[[Item, Values], None]:
        attr = self.name()
        if clause == "REMOVE":
            return lambda item, v: item.pop(attr, None)
        if clause == "SET":
            self.take("=")
            value = self.set_value()
            return lambda item, v: item.__setitem__(attr, value(item, v))
        token = self.take()
        if not token.startswith(":"):
            raise ExpressionError(f"{clause} takes a value placeholder, not {token!r}")
        if clause == "ADD":
            return lambda item, v: item.__setitem__(attr, _add(item.get(attr), _value(v, token)))
        if clause == "DELETE":
            return lambda item, v: _delete(item, attr, _value(v, token))
        raise ExpressionError(f"unsupported update clause {clause!r}")

    def set_value(self) -> Callable[[Item, Values], Any]:
        first = self.set_operand()
        if self.peek() in ("+", "-"):
            sign = 1 if self.take() == "+" else -1
            second = self.set_operand()
            return lambda item, v: first(item, v) + sign * second(item, v)
        return first

    def set_operand(self) -> Callable[[Item, Values], Any]:
        if (self.peek() or "").lower() == "if_not_exists":
            self.take()
            self.take("(")
            attr = self.name()
            self.take(",")
            fallback = self.operand()
            self.take(")")
            return lambda item, v: item[attr] if attr in item else fallback(item, v)
        operand = self.operand()

        def read(item: Item, v: Values) -> Any:
            got = operand(item, v)
            if got is _MISSING:
                raise ExpressionError("an update reads an attribute the item does not have")
            return got

        return read


def _value(values: Values, placeholder: str) -> Any:
    try:
        return values[placeholder]
    except KeyError:
        raise ExpressionError(f"value placeholder {placeholder} has no ExpressionAttributeValues entry") from None


def _compare(op: str, a: Any, b: Any) -> bool:
    if a is _MISSING or b is _MISSING:
        return op == "<>" and not (a is _MISSING and b is _MISSING)
    if op == "=":
        return a == b
    if op == "<>":
        return a != b
    if isinstance(a, bool) or isinstance(b, bool) or type(a) is not type(b):
        return False
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def _add(current: Any, value: Any) -> Any:
    if current is None:
        return set(value) if isinstance(value, (set, frozenset)) else value
    if isinstance(value, (set, frozenset)):
        return set(current) | set(value)
    return current + value


def _delete(item: Item, attr: str, value: Any) -> None:
    if attr in item:
        left = set(item[attr]) - set(value)
        if left:
            item[attr] = left
        else:  # DynamoDB never stores an empty set
            del item[attr]


@functools.lru_cache(maxsize=4096)
def _compiled(kind: str, text: str, names: tuple[tuple[str, str], ...]) -> Any:
    parser = _Parser(text, dict(names))
    out = parser.condition() if kind == "condition" else parser.update()
    parser.done()
    return out


def condition(text: str, names: Mapping[str, str] | None) -> Condition:
    return _compiled("condition", text, tuple(sorted((names or {}).items())))


def update(text: str, names: Mapping[str, str] | None) -> Callable[[Item, Values], None]:
    return _compiled("update", text, tuple(sorted((names or {}).items())))


@functools.lru_cache(maxsize=1024)
def _projection(text: str, names: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    lookup = dict(names)
    out = []
    for part in text.split(","):
        token = part.strip()
        if token.startswith("#"):
            if token not in lookup:
                raise ExpressionError(f"placeholder {token} has no ExpressionAttributeNames entry")
            token = lookup[token]
        out.append(token)
    return tuple(out)


def projection(text: str | None, names: Mapping[str, str] | None) -> tuple[str, ...] | None:
    """The attribute names a ProjectionExpression keeps; None keeps all."""
    return None if not text else _projection(text, tuple(sorted((names or {}).items())))


def key_condition(text: str, names: Mapping[str, str] | None, values: Values) -> tuple[str, Any, tuple[str, str, Any] | None]:
    """A Query's KeyConditionExpression as (hash attribute, its value, (sort attribute,
    comparator, value) or None): ``#h = :v`` optionally ``AND #s <op> :w``."""
    toks = _tokens(text)
    lookup = dict(names or {})

    def attr(tok: str) -> str:
        return lookup[tok] if tok.startswith("#") else tok

    if len(toks) == 3 and toks[1] == "=":
        return attr(toks[0]), _value(values, toks[2]), None
    if len(toks) == 7 and toks[1] == "=" and toks[3].upper() == "AND" and toks[5] in ("=", "<", "<=", ">", ">="):
        return attr(toks[0]), _value(values, toks[2]), (attr(toks[4]), toks[5], _value(values, toks[6]))
    raise ExpressionError(f"unsupported key condition {text!r}")
