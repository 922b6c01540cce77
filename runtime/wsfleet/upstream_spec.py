"""The START ``upstream`` object: how one connection talks to its upstream. No I/O.

Declared once, in :data:`FIELDS`: the router validates a START against it
(:func:`parse`), the CLI builds its ``wsfleet start`` flags from it, and docs/api.md's
table of the object is generated from it (a test fails when the docs drift). The
worker parses what the router stored with the same :func:`parse`, so a value the
router would refuse never reaches a socket either.

Secrets are never in it: ``secret_headers`` names Secrets Manager ARNs (under
``UPSTREAM_SECRET_PREFIX``), whose values the worker fetches at connect time
(:mod:`wsfleet.worker.secrets`). What is stored in the connection item and returned by
GET is :meth:`Upstream.item`: the keys that differ from their defaults, ARNs only.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .pointer import MAX_POINTER_LENGTH, MAX_POINTER_TOKENS, Pointer
from .upstream_feed import check_ignore, check_silence, pointer_of
from .stream import FrameShape, resume_url
from .upstream_secrets import MAX_JSON_KEY as MAX_JSON_KEY
from .upstream_secrets import SECRET_NAME_CHARS as SECRET_NAME_CHARS
from .upstream_secrets import SECRET_NOT_ALLOWED as SECRET_NOT_ALLOWED
from .upstream_secrets import INVALID as INVALID
from .upstream_secrets import SecretRef, check_secret_query, clip, fail, parse_secret_ref
from .validation import Invalid, plain_numbers


FROM_SEQ = "{from_seq}"  # replaced in open_message by the seq the stream resumes at
CONNECTION_ID = "{connection_id}"  # replaced in open_message by the connection id

MAX_HEADERS = 32  # headers and secret_headers together
MAX_HEADER_NAME = 128
MAX_HEADER_VALUE = 4096
MAX_SUBPROTOCOLS = 16
MAX_OPEN_MESSAGE = 8192

# RFC 9110 token: header names and subprotocols.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# A header value: visible ASCII, space and tab (no CR, LF or NUL: no header injection).
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
# Headers the WebSocket handshake sets itself; subprotocols have their own key.
_RESERVED_HEADERS = frozenset({"host", "connection", "upgrade", "content-length", "transfer-encoding", "te"})
_RESERVED_HEADER_PREFIX = "sec-websocket-"



class Resume(enum.Enum):
    """How a (re)connect asks the upstream to resume after what is stored."""

    QUERY = "query"  # the from_seq query parameter on ws_url (the default protocol)
    OPEN_MESSAGE = "open_message"  # only in the open message, through {from_seq}
    NONE = "none"  # the upstream cannot replay: what it sent meanwhile becomes an upstream_gap marker


class Format(enum.Enum):
    """How a frame's payload is read (whatever its opcode: a text frame of a binary feed is its UTF-8 bytes)."""

    JSON = "json"  # a JSON value, its seq and data where the pointers say
    TEXT = "text"  # any UTF-8 text, stored as a JSON string
    BINARY = "binary"  # bytes, stored in base64 (the read API's data_base64)


class SeqMode(enum.Enum):
    """Where a frame's seq comes from."""

    UPSTREAM = "upstream"  # read at seq_pointer; the upstream can resume at from_seq
    ASSIGNED = "assigned"  # the worker numbers accepted frames; a reconnect leaves a reconnect marker


DEFAULT_SEQ_POINTER = Pointer.parse("/seq")
DEFAULT_DATA_POINTER = Pointer.parse("/data")
WHOLE_FRAME = Pointer.parse("")  # the data pointer of an assigned-seq feed given none


@dataclass(frozen=True)
class Upstream:
    """One connection's upstream settings, validated. The default is the default protocol."""

    headers: tuple[tuple[str, str], ...] = ()
    secret_headers: tuple[tuple[str, SecretRef], ...] = ()
    subprotocols: tuple[str, ...] = ()
    open_message: str | None = None
    seq_pointer: Pointer = DEFAULT_SEQ_POINTER
    data_pointer: Pointer = DEFAULT_DATA_POINTER
    resume: Resume = Resume.QUERY
    format: Format = Format.JSON
    seq: SeqMode = SeqMode.UPSTREAM
    secret_query: tuple[tuple[str, SecretRef], ...] = ()
    ignore: tuple[tuple[Pointer, str], ...] = ()  # (pointer, value as canonical JSON)
    max_silence_seconds: int | None = None

    @property
    def assigned(self) -> bool:
        return self.seq is SeqMode.ASSIGNED

    def shape(self) -> FrameShape:
        """Where its frames keep seq and data, and how they are read (wsfleet.stream)."""
        return FrameShape(self.seq_pointer, self.data_pointer, self.format.value, self.assigned, self.ignore)

    @property
    def secret_refs(self) -> tuple[tuple[str, SecretRef], ...]:
        """Every secret this upstream uses: its secret headers, then its secret query parameters."""
        return self.secret_headers + self.secret_query

    def item(self) -> dict[str, Any]:
        """The stored and public form: only the keys that differ from their defaults
        (``{}`` for the default protocol), secrets as ARNs. Two STARTs ask for the same
        upstream exactly when their items are equal."""
        out: dict[str, Any] = {}
        if self.headers:
            out["headers"] = dict(self.headers)
        if self.secret_headers:
            out["secret_headers"] = {name: ref.text for name, ref in self.secret_headers}
        if self.subprotocols:
            out["subprotocols"] = list(self.subprotocols)
        if self.open_message is not None:
            out["open_message"] = self.open_message
        if self.seq_pointer != DEFAULT_SEQ_POINTER:
            out["seq_pointer"] = self.seq_pointer.text
        if self.data_pointer != (WHOLE_FRAME if self.assigned else DEFAULT_DATA_POINTER):
            out["data_pointer"] = self.data_pointer.text
        if self.resume is not Resume.QUERY:
            out["resume"] = self.resume.value
        if self.format is not Format.JSON:
            out["format"] = self.format.value
        if self.assigned:
            out["seq"] = self.seq.value
        if self.secret_query:
            out["secret_query"] = {name: ref.text for name, ref in self.secret_query}
        if self.ignore:
            out["ignore"] = [{"pointer": pointer.text, "equals": json.loads(equals)} for pointer, equals in self.ignore]
        if self.max_silence_seconds is not None:
            out["max_silence_seconds"] = self.max_silence_seconds
        return out

    def url(self, ws_url: str, from_seq: int) -> str:
        """The URL to open: with ``from_seq`` added when resuming by query (and the seqs
        are the upstream's: an assigned seq means nothing to it), else as given."""
        return resume_url(ws_url, from_seq) if self.resume is Resume.QUERY and not self.assigned else ws_url

    def opening(self, *, from_seq: int, connection_id: str) -> str | None:
        """The open message to send right after connecting, placeholders filled; None if none."""
        if self.open_message is None:
            return None
        return self.open_message.replace(FROM_SEQ, str(from_seq)).replace(CONNECTION_ID, connection_id)


DEFAULT = Upstream()


# --- the declaration ---------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One key of the ``upstream`` object: what it is, its default, its CLI flag."""

    key: str
    type: str  # as docs/api.md shows it
    default: str  # as docs/api.md shows it ("" for none)
    flag: str  # the wsfleet start option
    metavar: str
    repeat: bool  # the flag may be given several times (one entry each)
    help: str  # one sentence, for the CLI and docs/api.md
    check: Callable[[Any, "_Context"], Any] = field(repr=False, compare=False, default=lambda v, c: v)
    choices: tuple[str, ...] = ()  # the only values it takes, when it is one of a few


@dataclass(frozen=True)
class _Context:
    secret_prefix: str
    region: str | None


def _check_header_name(key: str, name: object) -> str:
    if not isinstance(name, str) or not _TOKEN.fullmatch(name) or len(name) > MAX_HEADER_NAME:
        raise fail(
            key,
            f"header name {clip(name)!r} is not an HTTP token (letters, digits and !#$%&'*+-.^_`|~, at most {MAX_HEADER_NAME}).",
        )
    lower = name.lower()
    if lower in _RESERVED_HEADERS or lower.startswith(_RESERVED_HEADER_PREFIX):
        raise fail(key, f"header {name} is set by the WebSocket handshake itself (subprotocols have their own key).")
    return name


def _mapping(key: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise fail(key, "must be an object of header name to value.")
    if len(value) > MAX_HEADERS:
        raise fail(key, f"at most {MAX_HEADERS} headers.")
    return value


def is_header_value(text: object) -> bool:
    """What a header value may be, plain or read from a secret: a string of at most
    MAX_HEADER_VALUE printable ASCII characters, spaces and tabs (no CR, LF or NUL: no
    header injection)."""
    return isinstance(text, str) and len(text) <= MAX_HEADER_VALUE and _HEADER_VALUE.fullmatch(text) is not None


def _check_headers(value: object, ctx: _Context) -> tuple[tuple[str, str], ...]:
    out = []
    for name, text in _mapping("headers", value).items():
        _check_header_name("headers", name)
        if not is_header_value(text):
            raise fail(
                "headers",
                f"the value of {name} must be a string of at most {MAX_HEADER_VALUE} printable ASCII "
                "characters (no CR, LF or other control characters).",
            )
        out.append((name, text))
    return tuple(out)


def _check_secret_headers(value: object, ctx: _Context) -> tuple[tuple[str, SecretRef], ...]:
    return tuple(
        (_check_header_name("secret_headers", name), parse_secret_ref(ref, ctx.secret_prefix, header=name, region=ctx.region))
        for name, ref in _mapping("secret_headers", value).items()
    )


def _check_subprotocols(value: object, ctx: _Context) -> tuple[str, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_SUBPROTOCOLS:
        raise fail("subprotocols", f"must be a list of 1 to {MAX_SUBPROTOCOLS} subprotocol names.")
    for name in value:
        if not isinstance(name, str) or not _TOKEN.fullmatch(name) or len(name) > MAX_HEADER_NAME:
            raise fail("subprotocols", f"{clip(name)!r} is not a subprotocol name (an HTTP token).")
    if len(set(value)) != len(value):
        raise fail("subprotocols", "lists a subprotocol twice.")
    return tuple(value)


def _check_open_message(value: object, ctx: _Context) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_OPEN_MESSAGE:
        raise fail("open_message", f"must be a string of 1 to {MAX_OPEN_MESSAGE} characters.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise fail("open_message", "must be valid Unicode (it has half of a surrogate pair).") from None
    return value


def _check_seq_pointer(value: object, ctx: _Context) -> Pointer:
    pointer = pointer_of("seq_pointer", value)
    if pointer.is_whole:
        raise fail("seq_pointer", 'must point into the frame ("" is the whole frame, which is not a seq).')
    return pointer


def _check_data_pointer(value: object, ctx: _Context) -> Pointer:
    return pointer_of("data_pointer", value)


def _enum_check(key: str, kind: type[enum.Enum]) -> Callable[[Any, _Context], Any]:
    def check(value: object, ctx: _Context) -> Any:
        try:
            return kind(value)
        except ValueError:
            raise fail(key, f"must be one of {', '.join(m.value for m in kind)}, got {clip(value)!r}.") from None

    return check


FIELDS: tuple[Field, ...] = (
    Field(
        "headers",
        "object",
        "",
        "--header",
        "NAME=VALUE",
        True,
        "HTTP headers sent with the handshake; not secret (stored, returned by GET).",
        _check_headers,
    ),
    Field(
        "secret_headers",
        "object",
        "",
        "--secret-header",
        "NAME=ARN[#KEY]",
        True,
        "Headers whose values the worker reads from Secrets Manager at connect time (ARN under "
        "UPSTREAM_SECRET_PREFIX; #KEY takes one field of a JSON secret); values are never stored, logged or returned.",
        _check_secret_headers,
    ),
    Field(
        "subprotocols",
        "list",
        "",
        "--subprotocol",
        "NAME",
        True,
        "WebSocket subprotocols offered in the handshake.",
        _check_subprotocols,
    ),
    Field(
        "open_message",
        "string",
        "",
        "--open-message",
        "TEXT",
        False,
        "Text sent after every connect and reconnect, {from_seq} and {connection_id} replaced.",
        _check_open_message,
    ),
    Field(
        "seq_pointer",
        "JSON Pointer",
        "/seq",
        "--seq-pointer",
        "POINTER",
        False,
        "Where a frame keeps its sequence number (an integer, 0 to 2^63-1).",
        _check_seq_pointer,
    ),
    Field(
        "data_pointer",
        "JSON Pointer",
        "/data",
        "--data-pointer",
        "POINTER",
        False,
        'The part of a frame stored as its data; "" stores the whole frame.',
        _check_data_pointer,
    ),
    Field(
        "resume",
        "query | open_message | none",
        "query",
        "--resume",
        "MODE",
        False,
        "How a reconnect resumes: the from_seq query parameter, only the open message's {from_seq}, "
        "or none (the upstream cannot replay; what was missed is stored as an upstream_gap marker).",
        _enum_check("resume", Resume),
        tuple(r.value for r in Resume),
    ),
    Field(
        "format",
        "json | text | binary",
        "json",
        "--format",
        "FORMAT",
        False,
        "How a frame is read: JSON; text (any UTF-8 text, stored as a JSON string); or binary (bytes, "
        "read back as data_base64). text and binary need seq assigned.",
        _enum_check("format", Format),
        tuple(f.value for f in Format),
    ),
    Field(
        "seq",
        "upstream | assigned",
        "upstream",
        "--seq",
        "MODE",
        False,
        "Where seqs come from: the upstream (read at seq_pointer), or assigned by the worker (stored end + 1, "
        "+ 2, ...; the data is the whole frame unless data_pointer says; a reconnect or takeover stores a "
        "reconnect marker, as such a feed cannot be resumed).",
        _enum_check("seq", SeqMode),
        tuple(m.value for m in SeqMode),
    ),
    Field(
        "secret_query",
        "object",
        "",
        "--secret-query",
        "NAME=ARN[#KEY]",
        True,
        "Query parameters the worker adds to ws_url at connect time, their values read from Secrets Manager (ARN "
        "under UPSTREAM_SECRET_PREFIX; #KEY takes one field of a JSON secret); never stored, logged or returned.",
        check_secret_query,
    ),
    Field(
        "ignore",
        "list",
        "",
        "--ignore",
        "POINTER=JSON",
        True,
        "Frames to drop (heartbeats, subscription acks): a JSON frame where any rule's pointer leads to its value "
        'is not stored, not malformed, leaves no marker (counted in IgnoredFrames); rules {"pointer", "equals"}, '
        "json format only.",
        check_ignore,
    ),
    Field(
        "max_silence_seconds",
        "integer",
        "",
        "--max-silence-seconds",
        "S",
        False,
        "No frame accepted for this long (1 to 86400 s) while connected: the socket is closed and opened again, "
        "resuming as usual (SilenceReconnects).",
        check_silence,
    ),
)
FIELD_NAMES = tuple(f.key for f in FIELDS)


def parse(value: object, *, secret_prefix: str, region: str | None = None) -> Upstream:
    """A START's ``upstream`` (absent: None) validated into :class:`Upstream`; raises
    :class:`~wsfleet.validation.Invalid` with a sentence naming the key otherwise.
    ``region``: the deployment's, that secret ARNs must name (None: any)."""
    if value is None:
        return DEFAULT
    if not isinstance(value, dict):
        raise Invalid(INVALID, "upstream must be a JSON object.")
    unknown = sorted(set(value) - set(FIELD_NAMES))
    if unknown:
        raise Invalid(INVALID, f"upstream has unknown key {unknown[0]!r}; the keys are {', '.join(FIELD_NAMES)}.")
    ctx = _Context(secret_prefix, region)
    value = plain_numbers(value)  # an item read back from the table holds its numbers as Decimal
    parsed = {f.key: f.check(value[f.key], ctx) for f in FIELDS if f.key in value}
    plain = {name.lower() for name, _ in parsed.get("headers", ())}
    for name, _ in parsed.get("secret_headers", ()):
        if name.lower() in plain:
            raise fail("secret_headers", f"header {name} is also in headers; give it once.")
    for key in ("headers", "secret_headers"):
        names = [name.lower() for name, _ in parsed.get(key, ())]
        if len(set(names)) != len(names):
            raise fail(key, "names a header twice (header names are case-insensitive).")
    if len(parsed.get("headers", ())) + len(parsed.get("secret_headers", ())) > MAX_HEADERS:
        raise Invalid(INVALID, f"upstream: at most {MAX_HEADERS} headers and secret_headers together.")
    if parsed.get("seq") is SeqMode.ASSIGNED:
        if "seq_pointer" in parsed:
            raise fail("seq_pointer", "reads an upstream seq; with seq assigned the worker numbers the frames.")
        parsed.setdefault("data_pointer", WHOLE_FRAME)
    elif parsed.get("format", Format.JSON) is not Format.JSON:
        raise fail("format", f"{parsed['format'].value} frames carry no seq to read: give seq assigned.")
    if parsed.get("format", Format.JSON) is not Format.JSON and "ignore" in parsed:
        raise fail("ignore", f"reads JSON frames; a {parsed['format'].value} frame is stored whole.")
    if parsed.get("format", Format.JSON) is not Format.JSON and "data_pointer" in value:
        raise fail("data_pointer", f"points into JSON; a {parsed['format'].value} frame is stored whole.")
    upstream = Upstream(**parsed)
    if upstream.resume is Resume.OPEN_MESSAGE and FROM_SEQ not in (upstream.open_message or ""):
        raise fail("resume", "open_message resumes only through an open_message that contains {from_seq}.")
    return upstream


# --- docs/api.md's table ----------------------------------------------------------------


def markdown_table() -> str:
    """docs/api.md's table of the ``upstream`` keys and their limits, from :data:`FIELDS`
    (a test fails when the docs' copy differs)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = [
        "| key | type | default | `wsfleet start` flag | meaning |",
        "|---|---|---|---|---|",
    ]
    for f in FIELDS:
        flag = f"`{f.flag} {f.metavar}`" + (" (repeatable)" if f.repeat else "")
        if f.choices:
            flag = f"`{f.flag} {'|'.join(f.choices)}`"
        default = f"`{f.default}`" if f.default else "none"
        rows.append(f"| `{f.key}` | {cell(f.type)} | {default} | {cell(flag)} | {cell(f.help)} |")
    limits = (
        f"Limits: at most {MAX_HEADERS} headers and secret_headers together, names of at most {MAX_HEADER_NAME} "
        f"characters, values of at most {MAX_HEADER_VALUE}; at most {MAX_SUBPROTOCOLS} subprotocols; an open_message "
        f"of at most {MAX_OPEN_MESSAGE} characters; a JSON key after `#` of at most {MAX_JSON_KEY}; pointers of at "
        f"most {MAX_POINTER_LENGTH} characters and {MAX_POINTER_TOKENS} tokens."
    )
    return "\n".join(rows) + "\n\n" + limits
