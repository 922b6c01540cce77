"""``wsfleet apply``'s file: the desired state of many connections, read and checked
before anything is sent, each entry remembered with the line it starts on.

A list of entries (YAML or JSON; a mapping with one key ``connections`` holding the list
too): ``connection_id``, ``ws_url``, ``desired`` (``running`` or ``stopped``) and the
START's ``upstream`` object, as a key ``upstream`` or its keys at the entry's top level
(:data:`wsfleet.upstream_spec.FIELDS`). What only the router can judge (its allowed
hosts, its secret prefix) is left to it: its 400 is that line's failure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..upstream_spec import FIELD_NAMES, parse
from ..validation import Invalid, check_connection_id

RUNNING, STOPPED = "running", "stopped"
KEYS = ("connection_id", "ws_url", "desired", "upstream")
# Judged by the router alone: the CLI does not know its UPSTREAM_SECRET_PREFIX.
SECRET_KEYS = ("secret_headers", "secret_query")
MAX_ERRORS = 20  # a file wrong throughout is reported by its first few lines


class BadFile(Exception):
    """The file cannot be applied: ``errors`` are its lines, each naming line and key."""

    def __init__(self, path: str, errors: list[str]) -> None:
        super().__init__(f"{path}: {len(errors)} error{'s' if len(errors) != 1 else ''}, nothing sent")
        self.errors = errors


@dataclass(frozen=True)
class Desired:
    line: int
    connection_id: str
    ws_url: str
    running: bool
    upstream: dict  # the stored form (upstream_spec's Upstream.item(), secrets as given): {} by default


def read(path: str) -> list[Desired]:
    """The entries of the file at ``path``, checked; :class:`BadFile` listing what is wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise BadFile(path, [f"{path}: cannot read it: {error.strerror or error}"]) from None
    except UnicodeDecodeError:
        raise BadFile(path, [f"{path}: not UTF-8 text"]) from None
    entries = _entries(path, text)
    desired, errors, seen = [], [], {}
    for line, entry in entries:
        try:
            one = _desired(line, entry)
        except Invalid as error:
            errors.append(f"{path}:{line}: {error.message.rstrip('.')}")
        else:
            if one.connection_id in seen:
                errors.append(f"{path}:{line}: connection_id {one.connection_id} is also on line {seen[one.connection_id]}")
            seen.setdefault(one.connection_id, line)
            desired.append(one)
        if len(errors) >= MAX_ERRORS:
            errors.append(f"{path}: stopped after {MAX_ERRORS} errors")
            break
    if errors:
        raise BadFile(path, errors)
    return desired


def _entries(path: str, text: str) -> list[tuple[int, Any]]:
    """(line, entry) for each entry of the list: JSON when the file starts with '[' or
    '{', else YAML."""
    stripped = text.lstrip()
    if not stripped:
        raise BadFile(path, [f"{path}: empty: expected a list of connections"])
    if stripped[0] in "[{":
        return _json_entries(path, text)
    return _yaml_entries(path, text)


def _top_list(path: str, value: Any, line: int) -> None:
    if not isinstance(value, list):
        raise BadFile(path, [f"{path}:{line}: expected a list of connections (or a mapping with the key connections)"])


def _json_entries(path: str, text: str) -> list[tuple[int, Any]]:
    decoder = json.JSONDecoder()

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    try:
        whole = json.loads(text)
    except ValueError as error:
        raise BadFile(path, [f"{path}:{error.lineno}: not valid JSON: {error.msg}"]) from None  # type: ignore[attr-defined]
    # Where each entry starts: the list is read again element by element, for its lines.
    start = text.index("[", text.index("connections") if isinstance(whole, dict) and "connections" in whole else 0)
    value = whole["connections"] if isinstance(whole, dict) and set(whole) == {"connections"} else whole
    _top_list(path, value, 1)
    out, pos = [], start + 1
    for entry in value:
        while text[pos] in " \t\r\n,":
            pos += 1
        _, end = decoder.raw_decode(text, pos)
        out.append((line_of(pos), entry))
        pos = end
    return out


def _yaml_entries(path: str, text: str) -> list[tuple[int, Any]]:
    try:
        import yaml
    except ImportError:
        raise BadFile(path, [f"{path}: reading YAML needs PyYAML (pip install './runtime[cli]'); or give JSON"]) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        whole = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        raise BadFile(path, [f"{path}{where}: not valid YAML: {problem}"]) from None
    if isinstance(whole, dict) and set(whole) == {"connections"}:
        node = next(v for k, v in node.value if k.value == "connections")
        whole = whole["connections"]
    _top_list(path, whole, 1 if node is None else node.start_mark.line + 1)
    return [(item.start_mark.line + 1, entry) for item, entry in zip(node.value, whole, strict=True)]


def _desired(line: int, entry: Any) -> Desired:
    if not isinstance(entry, dict):
        raise Invalid("invalid", "an entry must be a mapping of connection_id, ws_url, desired and the upstream keys")
    unknown = sorted(str(k) for k in set(entry) - set(KEYS) - set(FIELD_NAMES))
    if unknown:
        raise Invalid("invalid", f"unknown key {unknown[0]!r}; the keys are {', '.join(KEYS)} and the upstream keys "
                      f"({', '.join(FIELD_NAMES)})")
    for key in ("connection_id", "ws_url", "desired"):
        if key not in entry:
            raise Invalid("invalid", f"key {key!r} is missing")
    connection_id = check_connection_id(entry["connection_id"])
    where = f"connection {connection_id}: "
    ws_url = entry["ws_url"]
    if not isinstance(ws_url, str) or not ws_url.startswith(("ws://", "wss://")):
        raise Invalid("invalid", where + f"key 'ws_url' must be a ws:// or wss:// URL, got {ws_url!r}")
    if entry["desired"] not in (RUNNING, STOPPED):
        got = entry["desired"]
        hint = " (YAML reads on, yes and true as true: quote it)" if isinstance(got, bool) else ""
        raise Invalid("invalid", where + f"key 'desired' must be {RUNNING} or {STOPPED}, got {got!r}{hint}")
    flat = {k: v for k, v in entry.items() if k in FIELD_NAMES}
    if flat and "upstream" in entry:
        raise Invalid("invalid", where + f"give the upstream keys in 'upstream' or beside it, not both ({sorted(flat)[0]!r})")
    upstream = entry.get("upstream", flat)
    if upstream is None:
        upstream = {}
    if not isinstance(upstream, dict):
        raise Invalid("invalid", where + "key 'upstream' must be a mapping of the upstream keys")
    try:
        return Desired(line, connection_id, ws_url, entry["desired"] == RUNNING, stored_form(upstream))
    except Invalid as error:
        raise Invalid(error.code, where + error.message) from None


def stored_form(upstream: dict) -> dict:
    """``upstream`` as the API stores and answers it (defaults left out), checked as far
    as the CLI can (upstream_spec.parse); the secrets' ARNs are kept as given."""
    secrets = {k: upstream[k] for k in SECRET_KEYS if k in upstream}
    rest = {k: v for k, v in upstream.items() if k not in SECRET_KEYS}
    return {**parse(rest, secret_prefix="").item(), **secrets}
