"""The demo's streams of each upstream kind (CONTRACT.md section 3, the ``upstream``
object), and their audit against the upstream's books.

One connection per kind, beside the default-protocol ones:

* ``k-auth``: an authenticated upstream (``auth_header=X-Api-Key``); the START names a Secrets
  Manager secret in ``secret_headers``. :meth:`KindStreams.rotate` puts a new value in
  the secret, revokes the old credential at the upstream and cuts the socket: the
  worker's reconnect is refused (403) with its cached value, it fetches the secret again
  and carries on with the new one;
* ``k-subscribe``: subprotocol + subscribe message + nested frames: the resume point
  travels only in the open message (``resume: open_message``);
* ``k-flat``: flat frames whose whole body is the data (``data_pointer: ""``);
* ``k-none``: an upstream that cannot replay (``replay=none``, ``resume: none``): what
  it produced while nobody was connected is missed, and must be stored as one
  ``upstream_gap`` marker per reconnect. The demo's crash kills this one's owner;
* ``k-text`` and ``k-binary``: feeds with no seq (``seq: assigned``), read as text and as
  binary frames (``format=binary`` at the upstream): every frame stored as sent, in
  order, none twice, one ``reconnect`` marker at most per socket after the first.

The audit reads only independent evidence: the upstream's books (what each socket
asked, what it was sent, what the stream produced, in which shape) and the messages
table, never the workers' claims. The checks are pure functions of that evidence
(:func:`audit_replaying`, :func:`audit_live_only`) so that tests can feed them any
history.
"""

from __future__ import annotations

import base64
import json
import secrets as random_secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from wsfleet import schema
from wsfleet.upstream_spec import FROM_SEQ
from .secrets import put_secret
from .upstream import DEFAULT, FLAT, NESTED, SocketRecord

AUTH, SUBSCRIBE, FLAT_KIND, NONE = "k-auth", "k-subscribe", "k-flat", "k-none"
TEXT, BINARY = "k-text", "k-binary"
AUTH_HEADER = "X-Api-Key"
SUBPROTOCOL = "feed.v1"
# Refusals of the authenticated stream beyond which a rotation caused a storm: one 403
# per reconnect with a revoked credential, then a fresh fetch.
MAX_AUTH_REFUSALS = 3


@dataclass(frozen=True)
class KindStream:
    connection_id: str
    label: str
    query: str  # what configures the local upstream: the ws_url's query
    shape: str
    upstream: Mapping[str, Any]  # the START's upstream object
    live_only: bool = False
    assigned: bool = False  # seq assigned by the worker: audited by audit_assigned


def kind_streams(secret_arn: str) -> list[KindStream]:
    """The demo's six kinds; the authenticated one names ``secret_arn``."""
    subscribe = '{"op":"subscribe","stream":"' + SUBSCRIBE + '","from_seq":' + FROM_SEQ + "}"
    return [
        KindStream(AUTH, "authenticated: secret header from Secrets Manager, rotated", f"auth_header={AUTH_HEADER}", DEFAULT,
                   {"secret_headers": {AUTH_HEADER: secret_arn}}),
        KindStream(SUBSCRIBE, "subprotocol + subscribe (resume in the open message), nested frames",
                   f"subprotocol={SUBPROTOCOL}&subscribe=1&shape=nested", NESTED,
                   {"subprotocols": [SUBPROTOCOL], "open_message": subscribe, "resume": "open_message",
                    "seq_pointer": "/meta/sequence", "data_pointer": "/payload"}),
        KindStream(FLAT_KIND, "flat frames, the whole frame is the data", "shape=flat", FLAT,
                   {"seq_pointer": "/u", "data_pointer": ""}),
        KindStream(NONE, "no replay (resume none): a missed range becomes an upstream_gap marker", "replay=none", DEFAULT,
                   {"resume": "none"}, live_only=True),
        KindStream(TEXT, "text frames with no seq (format text, seq assigned)", "replay=none", DEFAULT,
                   {"format": "text", "seq": "assigned"}, assigned=True),
        KindStream(BINARY, "binary frames with no seq (format binary, seq assigned)", "replay=none&format=binary",
                   DEFAULT, {"format": "binary", "seq": "assigned"}, assigned=True),
    ]


# --- the audit (pure) -------------------------------------------------------------------


@dataclass(frozen=True)
class Gap:
    """One reconnect of a live-only stream: the marker stored for it, and what the
    upstream's books say was missed."""

    marker: tuple[int, int] | None  # (seq, skip_to) of the upstream_gap marker stored
    never_sent: tuple[int, int] | None  # produced while no socket was open: sent to nobody
    next_first: int  # the first seq the next socket was sent
    opened_at: float  # when that socket opened

    @property
    def lost_in_flight(self) -> tuple[int, int] | None:
        """Sent to the socket before but not stored (a crashed worker's unflushed frames)."""
        if self.marker is None:
            return None
        end = (self.never_sent[0] if self.never_sent else self.next_first) - 1
        return (self.marker[0], end) if end >= self.marker[0] else None


@dataclass
class KindAudit:
    connection_id: str
    label: str
    produced: int
    checkpoint: int
    rows: int  # data rows
    first: int | None  # lowest seq stored (data or marker)
    sockets: int
    refusals: dict[int, int] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # facts worth showing
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _split(items: Iterable[Mapping[str, Any]]) -> tuple[dict[int, Any], dict[int, tuple[int, str]]]:
    """(seq -> message_data, seq -> (last seq it stands for, reason)) of stored items."""
    data: dict[int, Any] = {}
    markers: dict[int, tuple[int, str]] = {}
    for item in items:
        seq = int(item[schema.MSG_SK])
        if schema.SKIPPED in item:
            markers[seq] = (int(item.get(schema.SKIP_TO, seq)), str(item[schema.SKIPPED]))
        else:
            data[seq] = item.get(schema.MESSAGE_DATA)
    return data, markers


def _ranges(seqs: Iterable[int]) -> str:
    out: list[str] = []
    for s in sorted(seqs):
        if out and out[-1][1] == s - 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out[:5])
    return text + (f" and {len(out) - 5} more ranges" if len(out) > 5 else "")


def _check_data(audit: KindAudit, data: Mapping[int, Any], expected: Mapping[int, str | None]) -> None:
    wrong = [s for s, d in data.items() if expected.get(s) is None or d != expected[s]]
    if wrong:
        audit.problems.append(f"stored data differs from what the upstream sent at seqs {_ranges(wrong)}")


def audit_replaying(
    stream: KindStream, *, produced: int, checkpoint: int, items: Sequence[Mapping[str, Any]],
    expected: Mapping[int, str | None], sockets: Sequence[SocketRecord], refusals: Mapping[int, int] | None = None,
) -> KindAudit:
    """A stream that replays from where it is asked: exactly 1..checkpoint stored, each
    seq once with the data the upstream sent, no marker; every socket resumed where the
    stored data ended (through the query or the subscribe message)."""
    data, markers = _split(items)
    audit = KindAudit(stream.connection_id, stream.label, produced, checkpoint, len(data),
                      min([*data, *markers], default=None), len(sockets), dict(refusals or {}))
    if checkpoint < 1:
        audit.problems.append("nothing was stored")
    missing = [s for s in range(1, checkpoint + 1) if s not in data]
    if missing:
        audit.problems.append(f"lost: seqs {_ranges(missing)} are not stored")
    beyond = [s for s in data if s > checkpoint]
    if beyond:
        audit.problems.append(f"seqs {_ranges(beyond)} are stored beyond the checkpoint {checkpoint}")
    if markers:
        audit.problems.append(f"skip markers at seqs {_ranges(markers)}, where nothing was skipped")
    _check_data(audit, data, expected)
    subscribing = "subscribe=1" in stream.query
    for r in sockets:
        if r.first_seq_sent is None:
            continue
        asked = r.subscribed_from if subscribing else r.from_seq
        if subscribing and r.subscribed_from is None:
            audit.problems.append(f"socket {r.id} was sent frames without a subscribe message")
        elif asked != r.first_seq_sent:
            audit.problems.append(f"socket {r.id} asked for {asked} but was sent from {r.first_seq_sent}")
    if subscribing:
        audit.notes.append(f"{len(sockets)} sockets, each subscribed with its resume point"
                           f" ({', '.join(str(r.subscribed_from) for r in sockets)})")
    return audit


def live_only_gaps(sockets: Sequence[SocketRecord], markers: Mapping[int, tuple[int, str]]) -> list[Gap]:
    """Each socket after the first that was sent frames, with the range nobody was sent
    before it and the marker (if any) that ends right before its first seq."""
    by_end = {end: seq for seq, (end, reason) in markers.items() if reason == schema.SKIPPED_UPSTREAM_GAP}
    out: list[Gap] = []
    sent_before = 0
    for r in sorted(sockets, key=lambda r: r.id):
        if r.first_seq_sent is None:
            continue
        if sent_before:
            nobody = (sent_before + 1, r.first_seq_sent - 1) if r.first_seq_sent - 1 > sent_before else None
            end = r.first_seq_sent - 1
            marker = (by_end[end], end) if end in by_end else None
            if nobody is not None or marker is not None:
                out.append(Gap(marker, nobody, r.first_seq_sent, r.opened_at))
        sent_before = max(sent_before, r.last_seq_sent)
    return out


def audit_live_only(
    stream: KindStream, *, produced: int, checkpoint: int, items: Sequence[Mapping[str, Any]],
    expected: Mapping[int, str | None], sockets: Sequence[SocketRecord],
) -> KindAudit:
    """A stream that cannot replay: stored from the first seq its first socket was sent
    (no marker below it: it started where the upstream was), every seq up to the
    checkpoint a data row with what was sent or inside an upstream_gap marker, and each
    marker exactly one reconnect's miss: it ends right before the next socket's first
    seq and covers what the upstream produced while no socket was open."""
    data, markers = _split(items)
    audit = KindAudit(stream.connection_id, stream.label, produced, checkpoint, len(data),
                      min([*data, *markers], default=None), len(sockets))
    started = min((r.first_seq_sent for r in sockets if r.first_seq_sent is not None), default=None)
    if checkpoint < 1 or started is None:
        audit.problems.append("nothing was stored")
        return audit
    if audit.first is not None and audit.first < started:
        audit.problems.append(f"stored from seq {audit.first}, below {started} where its first socket started")
    covered = set(data)
    for seq, (end, _) in markers.items():
        covered.update(range(seq, end + 1))
    missing = [s for s in range(started, checkpoint + 1) if s not in covered]
    if missing:
        audit.problems.append(f"lost: seqs {_ranges(missing)} are neither stored nor in a marker")
    _check_data(audit, data, expected)
    audit.gaps = live_only_gaps(sockets, markers)
    explained = {g.marker[0] for g in audit.gaps if g.marker is not None}
    for seq, (end, reason) in sorted(markers.items()):
        if seq not in explained:
            audit.problems.append(f"a {reason} marker {seq}-{end} that no reconnect explains")
    for g in audit.gaps:
        if g.marker is None:
            audit.problems.append(f"seqs {g.never_sent[0]}-{g.never_sent[1]} were sent to nobody and no marker says so")
        elif g.never_sent is not None and g.marker[0] > g.never_sent[0]:
            audit.problems.append(f"the marker {g.marker[0]}-{g.marker[1]} does not cover {g.never_sent[0]}-{g.never_sent[1]}, sent to nobody")
    return audit


def audit_assigned(
    stream: KindStream, *, produced: int, checkpoint: int, items: Sequence[Mapping[str, Any]],
    frames: Mapping[int, bytes], sockets: Sequence[SocketRecord],
) -> KindAudit:
    """A feed whose seqs the worker assigns (``frames``: the upstream's, by its own seq):
    stored from seq 1, or from a reconnect marker where its first owner died before it
    stored anything; each data row a frame the upstream produced, byte for byte (text:
    its UTF-8; binary: its base64), in the order produced and none twice; every marker a
    ``reconnect`` one, at most one per socket after the first."""
    data, markers = _split(items)
    audit = KindAudit(stream.connection_id, stream.label, produced, checkpoint, len(data),
                      min([*data, *markers], default=None), len(sockets))
    if not data:
        audit.problems.append("nothing was stored")
        return audit
    if audit.first != 1 and audit.first not in markers:
        # A first owner that died before its first write stored nothing, and the feed
        # cannot replay: the next owner's first row is its reconnect marker (at the start
        # of its block of seqs), saying frames are missing before it. Anything else must
        # start at 1.
        audit.problems.append(f"stored from seq {audit.first}, not 1")
    binary = "format=binary" in stream.query
    sent = {frame: seq for seq, frame in frames.items()}
    order = []
    for seq, stored in sorted(data.items()):
        text = json.loads(stored) if isinstance(stored, str) else None
        frame = base64.b64decode(text) if binary and isinstance(text, str) else str(text).encode()
        if frame not in sent:
            audit.problems.append(f"seq {seq} holds a frame the upstream never sent")
        else:
            order.append(sent[frame])
    if order != sorted(set(order)):
        audit.problems.append("frames stored out of the upstream's order, or twice")
    reasons = {reason for _, reason in markers.values()}
    if reasons - {schema.SKIPPED_RECONNECT}:
        audit.problems.append(f"markers other than reconnect: {sorted(reasons)}")
    if len(markers) > max(0, len(sockets) - 1):
        audit.problems.append(f"{len(markers)} reconnect markers for {len(sockets)} sockets")
    audit.notes.append(f"{len(data)} frames as sent (upstream frames {min(order, default=0)}-{max(order, default=0)}), "
                       f"{len(markers)} reconnect marker(s) at seqs {_ranges(markers) or 'none'} for {len(sockets)} sockets")
    return audit


def leaks(values: Iterable[str], texts: Mapping[str, str]) -> list[str]:
    """The names of the texts (logs, items, GET bodies) that contain any of ``values``."""
    values = [v for v in values if v]
    return sorted(name for name, text in texts.items() if any(v in text for v in values))


# --- running them on a fleet --------------------------------------------------------------


class KindStreams:
    """Starts the kind connections on a :class:`~sim.fleet.Fleet`, rotates the
    credential, and audits them at the end."""

    def __init__(self, fleet: Any, say: Callable[[str], None]) -> None:
        self.fleet = fleet
        self.say = say
        self.credentials: list[str] = []  # every value the secret held (the leak check looks for them)
        self.streams: list[KindStream] = []
        self.rotated_at: float | None = None
        self.secret_arn = ""
        self.secret_name = f"demo/{random_secrets.token_hex(4)}/api-key"

    @property
    def ids(self) -> list[str]:
        return [k.connection_id for k in self.streams]

    def start(self) -> list[str]:
        """Put the credential in Secrets Manager, tell the upstream to accept it, START
        each kind; returns the connection ids."""
        first = self._new_credential()
        self.secret_arn = put_secret(self.fleet.emulator.endpoint_url, self.secret_name, first)
        self.fleet.upstream.set_credentials([first])
        self.streams = kind_streams(self.secret_arn)
        for k in self.streams:
            self.fleet.start_connection(k.connection_id, f"{self.fleet.ws_url(k.connection_id)}?{k.query}",
                                        upstream=k.upstream, shape=k.shape)
        self.say(f"           upstream kinds: {', '.join(self.ids)} (secret {self.secret_arn})")
        return self.ids

    def rotate(self) -> None:
        """A rotation: the new value in the secret, the old one revoked at the upstream,
        and the socket cut, so that the reconnect must use the new value."""
        new = self._new_credential()
        put_secret(self.fleet.emulator.endpoint_url, self.secret_name, new)
        self.fleet.upstream.set_credentials([new])
        self.rotated_at = time.time()
        dropped = self.fleet.upstream.drop(AUTH)
        self.say(f"           rotated the {AUTH} credential: old one revoked, {dropped} socket cut")

    def cut(self) -> None:
        """The upstream drops the replaying kinds' other sockets (as a restarting source
        does): their reconnects must resume from the stored end, the subscribe one
        through its open message alone."""
        dropped = sum(self.fleet.upstream.drop(cid) for cid in (SUBSCRIBE, FLAT_KIND))
        self.say(f"           the upstream cut {dropped} sockets of {SUBSCRIBE} and {FLAT_KIND}: they resume from what is stored")

    def _new_credential(self) -> str:
        value = "demo-" + random_secrets.token_urlsafe(12)
        self.credentials.append(value)
        return value

    def owner_of_live_only(self) -> str | None:
        """The worker owning the live-only stream now (the crash's victim)."""
        return self.fleet.sample().owners().get(NONE) or None

    def audit(self) -> list[KindAudit]:
        up = self.fleet.upstream
        states = self.fleet.scan()
        out = []
        for k in self.streams:
            cid = k.connection_id
            evidence = dict(
                produced=up.produced(cid), checkpoint=states[cid].last_seq if cid in states else 0,
                items=self.fleet.messages(cid), expected=up.expected_data(cid), sockets=up.sockets(cid),
            )
            if k.live_only:
                out.append(audit_live_only(k, **evidence))
                continue
            if k.assigned:
                del evidence["expected"]
                out.append(audit_assigned(k, frames=up.frames(cid), **evidence))
                continue
            audit = audit_replaying(k, refusals=up.refusals(cid), **evidence)
            if cid == AUTH:
                self._audit_rotation(audit, evidence["sockets"])
            out.append(audit)
        self._audit_leaks(out)
        return out

    def _audit_rotation(self, audit: KindAudit, sockets: Sequence[SocketRecord]) -> None:
        refused = sum(audit.refusals.values())
        audit.notes.append(f"handshakes refused: {refused} ({', '.join(f'{n} x {s}' for s, n in sorted(audit.refusals.items())) or 'none'})")
        if self.rotated_at is None:
            return
        after = [r for r in sockets if r.opened_at >= self.rotated_at and r.first_seq_sent is not None]
        if not after:
            audit.problems.append("no socket was accepted after the rotation")
        else:
            audit.notes.append(f"after the rotation: accepted with the new credential {time.strftime('%H:%M:%S', time.localtime(after[0].opened_at))}, sent from seq {after[0].first_seq_sent}")
        if refused > MAX_AUTH_REFUSALS:
            audit.problems.append(f"{refused} refused handshakes: a refusal storm (at most {MAX_AUTH_REFUSALS} expected)")
        if audit.refusals.get(401):
            audit.problems.append("the credential header was missing from a handshake (401)")

    def _audit_leaks(self, audits: list[KindAudit]) -> None:
        texts = {p.name: p.read_text(errors="replace") for p in sorted(self.fleet.run_dir.glob("*.log"))}
        for cid in self.ids:
            texts[f"GET /connections/{cid}"] = json.dumps(self.fleet.get_connection(cid)[1])
        texts["connections table"] = json.dumps(self.fleet._scan_items(self.fleet.aws_env["TABLE_NAME"]), default=str)
        found = leaks(self.credentials, texts)
        target = next(a for a in audits if a.connection_id == AUTH)
        if found:
            target.problems.append(f"a secret value appears in: {', '.join(found)}")
        else:
            target.notes.append(f"secret values found in none of {len(texts)} logs, items and GET bodies")


def lines(audits: Sequence[KindAudit], *, t_origin: float, crash: tuple[str, float] | None = None) -> list[str]:
    """The report's section on the upstream kinds."""
    out = ["", "UPSTREAM KINDS (each audited against the upstream's books)"]
    for a in audits:
        verdict = "ok" if a.ok else "FAILED"
        out.append(f"  {a.connection_id:12} {verdict:6} {a.label}")
        out.append(f"  {'':12}        produced {a.produced}, checkpoint {a.checkpoint}, data rows {a.rows}"
                   f" (from seq {a.first}), sockets {a.sockets}")
        for g in a.gaps:
            when = f"+{g.opened_at - t_origin:.1f}s"
            if crash is not None and g.opened_at >= crash[1]:
                when += f", after kill -9 of {crash[0]}"
                crash = None  # only the first reconnect after it is the crash's
            marker = f"one upstream_gap marker {g.marker[0]}-{g.marker[1]}" if g.marker else "NO marker"
            nobody = f"{g.never_sent[0]}-{g.never_sent[1]}" if g.never_sent else "none"
            lost = g.lost_in_flight
            out.append(f"  {'':12}        reconnect {when}: missed seqs stored as {marker}; sent to nobody: {nobody}"
                       + (f"; sent to the old socket, never stored: {lost[0]}-{lost[1]}" if lost else ""))
        for note in a.notes:
            out.append(f"  {'':12}        {note}")
        for problem in a.problems:
            out.append(f"  {'':12}        PROBLEM: {problem}")
    return out
