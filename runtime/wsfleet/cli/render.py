"""Tables for people: what each command prints without ``--json``, from the same data
``--json`` prints (see ``views``) or the API's reply body."""

from __future__ import annotations

import base64
import json
from typing import Any, Mapping, Sequence

from .. import schema


def duration(seconds: float) -> str:
    s = abs(seconds)
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(map(str, headers))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def status(view: Mapping[str, Any]) -> str:
    """The fleet at a glance (``views.status``)."""
    lines = []
    workers = view["workers"]
    lines.append(f"workers: {len(workers)} live session{'s' if len(workers) != 1 else ''}")
    if workers:
        rows = [
            (
                w["worker_id"],
                duration(w["session_age_s"]),
                f"{w['active']}/{w['max_connections']}",
                duration(w["heartbeat_age_s"]) + " ago",
                duration(w["expires_in_s"]),
            )
            for w in workers
        ]
        lines.append(_indent(table(("WORKER", "SESSION AGE", "ACTIVE/MAX", "HEARTBEAT", "EXPIRES IN"), rows)))
    dead = view["sessions_not_live_holding"]
    if dead:
        lines.append(f"sessions not live that may still hold connections: {len(dead)}")
        rows = [(d["worker_id"], d["state"], duration(d["expired_s_ago"]) + " ago", d["ended_by"] or "-") for d in dead]
        lines.append(_indent(table(("WORKER", "STATE", "EXPIRED", "ENDED BY"), rows)))
    counts = view["connections"]
    lines.append(f"connections: {counts['STARTED']} STARTED, {counts['STOPPED']} STOPPED ({counts['total']} in all)")
    unowned = view["unowned"]
    lines.append(f"STARTED but unowned: {len(unowned)}")
    if unowned:
        rows = [
            (
                u["connection_id"],
                u["partition"] if not u["worker_id"] else f"{u['worker_id']} ({u['session_state']})",
                duration(u["unowned_for_s"]),
            )
            for u in unowned
        ]
        lines.append(_indent(table(("CONNECTION", "WHERE", "FOR"), rows)))
    refused = view["refused"]
    lines.append(f"STARTED and refused by their upstream: {len(refused)}")
    if refused:
        rows = [
            (r["connection_id"], duration(r["since_s"]) + " ago", _clip(_one_line(r["last_error"]), ERROR_WIDTH))
            for r in refused
        ]
        lines.append(_indent(table(("CONNECTION", "SINCE", "LAST ERROR"), rows)))
    quarantined = view["quarantined"]
    lines.append(f"STARTED and quarantined (wsfleet retry ID runs one again): {len(quarantined)}")
    if quarantined:
        rows = [(q["connection_id"], duration(q["since_s"]) + " ago", _clip(_one_line(q["reason"]), ERROR_WIDTH)) for q in quarantined]
        lines.append(_indent(table(("CONNECTION", "SINCE", "REASON"), rows)))
    oldest = view["oldest_checkpoint"]
    if oldest:
        lines.append(
            f"oldest checkpoint of an owned connection: {oldest['connection_id']}, {duration(oldest['age_s'])} ago"
        )
    else:
        lines.append("oldest checkpoint of an owned connection: none owned")
    alarms = view.get("alarms")  # with --stack
    if alarms is not None and alarms["firing"] is None:
        lines.append(f"alarms {alarms['prefix']}*: not read ({alarms['error']})")
    elif alarms is not None:
        lines.append(f"alarms {alarms['prefix']}* in ALARM: {len(alarms['firing'])}")
        rows = [(a["name"], a["since"][:19], _clip(_one_line(a["reason"]), ERROR_WIDTH)) for a in alarms["firing"]]
        if rows:
            lines.append(_indent(table(("ALARM", "SINCE", "REASON"), rows)))
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def connection(body: Mapping[str, Any], now: int) -> str:
    """A connection's public state as the API returned it, its times explained."""
    rows = []
    for key, value in body.items():
        if key == schema.LEASE_EXPIRES_AT_MS and isinstance(value, int):
            value = f"{value}  ({_when(value, now) if value else 'free'})"
        elif key in (schema.UPDATED_AT_MS, schema.LAST_ERROR_AT_MS, schema.LAST_FRAME_AT_MS) and isinstance(value, int) and value:
            value = f"{value}  ({_when(value, now)})"
        elif key == schema.LAST_FRAME_AT_MS and value == 0:
            value = "0  (none counted yet)"
        elif key == schema.BYTES and isinstance(value, int):
            value = f"{value:,}  ({human_bytes(value)})" if value >= 1024 else f"{value:,}"
        elif key == schema.FRAMES and isinstance(value, int):
            value = f"{value:,}"
        elif key == schema.LAST_ERROR and isinstance(value, str):
            value = _one_line(value)
        elif key == schema.QUARANTINED and isinstance(value, dict):
            value = f"{_one_line(str(value.get('reason', '')))}  ({_when(int(value.get('at_ms', 0)), now)})"
        elif key == schema.UPSTREAM and isinstance(value, dict):
            # Its stored form: secret ARNs, never values. {} is the default protocol.
            value = json.dumps(value, separators=(",", ":")) if value else "default"
        rows.append((key, "-" if value in ("", None) else value))
    return table(("FIELD", "VALUE"), rows)


def connections(rows: Sequence[Mapping[str, Any]], now: int) -> str:
    """One line per connection; UPSTREAM and LAST ERROR columns only when a row has one."""
    if not rows:
        return "no connections"
    headers = ["CONNECTION", "STATE", "OWNER", "FENCE", "LAST SEQ", "UPDATED", "WS URL"]
    cells = [
        [
            r["connection_id"],
            r["desired_state"],
            r["owner"],
            r["fence_token"],
            r["last_seq"],
            duration((now - r["updated_at_ms"]) / 1000) + " ago",
            r["ws_url"],
        ]
        for r in rows
    ]
    if any(r.get("upstream") for r in rows):
        headers.append("UPSTREAM")
        for row, r in zip(cells, rows, strict=True):
            row.append(upstream_summary(r.get("upstream") or {}))
    if any(r.get("last_error") for r in rows):
        headers.append("LAST ERROR")
        for row, r in zip(cells, rows, strict=True):
            row.append(_clip(_one_line(r["last_error"]), ERROR_WIDTH) if r.get("last_error") else "-")
    return table(headers, cells)


ERROR_WIDTH = 80  # characters of a last_error a table line shows; --json shows it whole


def upstream_summary(upstream: Mapping[str, Any]) -> str:
    """A connection's upstream in a few words: the resume mode, the pointers that are not
    the default, and header names (never a value, secret or not); "default" for {}."""
    if not upstream:
        return "default"
    parts = [f"resume={upstream.get('resume', 'query')}"]
    for key, short in (("seq_pointer", "seq"), ("data_pointer", "data")):
        if key in upstream:
            parts.append(f"{short}={upstream[key] or '(whole)'}")
    for key, short in (("headers", "headers"), ("secret_headers", "secrets")):
        if upstream.get(key):
            parts.append(f"{short}={','.join(upstream[key])}")
    if upstream.get("subprotocols"):
        parts.append(f"subprotocols={','.join(upstream['subprotocols'])}")
    if "open_message" in upstream:
        parts.append("open_message")
    return " ".join(parts)


MESSAGE_WIDTH = 200  # characters of data a line shows; --json shows it whole


def message(entry: Mapping[str, Any]) -> str:
    """One entry of the read API as one line: its seq, then its data (clipped), or
    what stands in its place: a skip marker (why, which seqs, how large) or large data
    not fetched."""
    seq = entry["seq"]
    if "skipped" in entry:
        details = [str(entry["skipped"])]
        if "to_seq" in entry:
            details.append(f"seqs {seq}-{entry['to_seq']}")
        if "data_bytes" in entry:
            details.append(f"{entry['data_bytes']:,} bytes")
        return f"{seq}  (skipped: {', '.join(details)})"
    if "data_base64" in entry:
        return f"{seq}  {_binary(entry['data_base64'])}"
    if "data_url" in entry:
        return f"{seq}  (large data: {entry.get('data_bytes', 0):,} bytes at its data_url; --follow-urls fetches it)"
    return f"{seq}  {_clip(json.dumps(entry.get('data'), ensure_ascii=False, separators=(',', ':')), MESSAGE_WIDTH)}"


def human_bytes(n: int) -> str:
    """A byte count as an operator reads it: "512 B", "1.5 KiB", "3.2 GiB"."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _binary(text: object) -> str:
    """A binary feed's bytes (base64 in the entry) as hex, clipped, with their size."""
    try:
        raw = base64.b64decode(str(text), validate=True)
    except ValueError:
        return f"(binary, not base64: {_clip(str(text), MESSAGE_WIDTH)})"
    return f"({len(raw):,} bytes) {_clip(raw.hex(' '), MESSAGE_WIDTH)}"


def _when(ms: int, now: int) -> str:
    """An epoch-ms time as an operator reads it: "in 8.2s" or "3.1s ago"."""
    return f"in {duration((ms - now) / 1000)}" if ms > now else f"{duration((now - ms) / 1000)} ago"


def _one_line(text: str) -> str:
    """A worker's error text on one table line, whatever whitespace it holds."""
    return " ".join(text.split())


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
