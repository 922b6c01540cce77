"""The START ``upstream`` object: how one connection talks to its upstream. No I/O.

Declared once, in :data:`FIELDS`: the router validates a START against it
(:func:`parse`), the CLI builds its ``wsfleet start`` flags from it, and the README's
table of the object is generated from it (a test fails when the README drifts). The
worker parses what the router stored with the same :func:`parse`, so a value the
router would refuse never reaches a socket either.

Secrets are never in it: ``secret_headers`` names Secrets Manager ARNs (under
``UPSTREAM_SECRET_PREFIX``), whose values the worker fetches at connect time
(:mod:`wsfleet.worker.secrets`). What is stored in the connection item and returned by
GET is :meth:`Upstream.item`: the keys that differ from their defaults, ARNs only.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .pointer import MAX_POINTER_LENGTH, MAX_POINTER_TOKENS, Pointer, PointerError
from .stream import resume_url
from .validation import Invalid

INVALID = "invalid_upstream"
SECRET_NOT_ALLOWED = "secret_not_allowed"

FROM_SEQ = "{from_seq}"  # replaced in open_message by the seq the stream resumes at
CONNECTION_ID = "{connection_id}"  # replaced in open_message by the connection id

MAX_HEADERS = 32  # headers and secret_headers together
MAX_HEADER_NAME = 128
MAX_HEADER_VALUE = 4096
MAX_SUBPROTOCOLS = 16
MAX_OPEN_MESSAGE = 8192
MAX_JSON_KEY = 256

# RFC 9110 token: header names and subprotocols.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# A header value: visible ASCII, space and tab (no CR, LF or NUL: no header injection).
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
# Headers the WebSocket handshake sets itself; subprotocols have their own key.
_RESERVED_HEADERS = frozenset({"host", "connection", "upgrade", "content-length", "transfer-encoding", "te"})
_RESERVED_HEADER_PREFIX = "sec-websocket-"
# A Secrets Manager secret ARN: the name after "secret:" (with the 6-character suffix
# Secrets Manager adds) is what UPSTREAM_SECRET_PREFIX must prefix.
SECRET_NAME_CHARS = r"A-Za-z0-9/_+=.@-"
_SECRET_ARN = re.compile(
    r"arn:aws[a-z-]*:secretsmanager:(?P<region>[a-z0-9-]+):[0-9]{12}:secret:(?P<name>[" + SECRET_NAME_CHARS + r"]{1,512})"
)
_JSON_KEY = re.compile(r"[\x20-\x7e]{1,%d}" % MAX_JSON_KEY)


class Resume(enum.Enum):
    """How a (re)connect asks the upstream to resume after what is stored."""

    QUERY = "query"  # the from_seq query parameter on ws_url (the default protocol)
    OPEN_MESSAGE = "open_message"  # only in the open message, through {from_seq}
    NONE = "none"  # the upstream cannot replay: what it sent meanwhile becomes an upstream_gap marker


DEFAULT_SEQ_POINTER = Pointer.parse("/seq")
DEFAULT_DATA_POINTER = Pointer.parse("/data")


@dataclass(frozen=True)
class SecretRef:
    """A Secrets Manager secret (its ARN), and the field of its JSON value to use (None:
    the whole SecretString)."""

    arn: str
    json_key: str | None = None

    @property
    def text(self) -> str:
        return self.arn if self.json_key is None else f"{self.arn}#{self.json_key}"


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
    secret_query: tuple[tuple[str, SecretRef], ...] = ()

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
        if self.data_pointer != DEFAULT_DATA_POINTER:
            out["data_pointer"] = self.data_pointer.text
        if self.resume is not Resume.QUERY:
            out["resume"] = self.resume.value
        if self.secret_query:
            out["secret_query"] = {name: ref.text for name, ref in self.secret_query}
        return out

    def url(self, ws_url: str, from_seq: int) -> str:
        """The URL to open: with ``from_seq`` added when resuming by query, else as given."""
        return resume_url(ws_url, from_seq) if self.resume is Resume.QUERY else ws_url

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
    type: str  # as the README shows it
    default: str  # as the README shows it ("" for none)
    flag: str  # the wsfleet start option
    metavar: str
    repeat: bool  # the flag may be given several times (one entry each)
    help: str  # one sentence, for the CLI and the README
    check: Callable[[Any, "_Context"], Any] = field(repr=False, compare=False, default=lambda v, c: v)
    choices: tuple[str, ...] = ()  # the only values it takes, when it is one of a few


@dataclass(frozen=True)
class _Context:
    secret_prefix: str
    region: str | None


def _fail(key: str, message: str, code: str = INVALID) -> Invalid:
    return Invalid(code, f"upstream.{key}: {message}")


def _clip(value: object, width: int = 80) -> object:
    return value[:width] + "..." if isinstance(value, str) and len(value) > width else value


def _check_header_name(key: str, name: object) -> str:
    if not isinstance(name, str) or not _TOKEN.fullmatch(name) or len(name) > MAX_HEADER_NAME:
        raise _fail(
            key,
            f"header name {_clip(name)!r} is not an HTTP token (letters, digits and !#$%&'*+-.^_`|~, at most {MAX_HEADER_NAME}).",
        )
    lower = name.lower()
    if lower in _RESERVED_HEADERS or lower.startswith(_RESERVED_HEADER_PREFIX):
        raise _fail(key, f"header {name} is set by the WebSocket handshake itself (subprotocols have their own key).")
    return name


def _mapping(key: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _fail(key, "must be an object of header name to value.")
    if len(value) > MAX_HEADERS:
        raise _fail(key, f"at most {MAX_HEADERS} headers.")
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
            raise _fail(
                "headers",
                f"the value of {name} must be a string of at most {MAX_HEADER_VALUE} printable ASCII "
                "characters (no CR, LF or other control characters).",
            )
        out.append((name, text))
    return tuple(out)


def parse_secret_ref(
    text: object, secret_prefix: str, key: str = "secret_headers", *, header: str = "", region: str | None = None
) -> SecretRef:
    """``ARN`` or ``ARN#json-key``, the secret's name under ``secret_prefix`` and, when
    ``region`` is given, in that region (the workers may read secrets of their own region
    only: one elsewhere could never be read, so it is refused here rather than at every
    connect). ``header``: the header it is for, named in the error. A value that is not
    an ARN is never repeated in the error: it may be the secret itself, pasted in by mistake."""
    where = f"the value of {header}" if header else "a secret"
    if not isinstance(text, str):
        raise _fail(key, f"{where} must be a Secrets Manager ARN string (optionally ARN#json-key).")
    arn, sep, json_key = text.partition("#")
    match = _SECRET_ARN.fullmatch(arn)
    if match is None:
        raise _fail(
            key,
            f"{where} is not a Secrets Manager secret ARN (arn:aws:secretsmanager:<region>:<account>:secret:<name>"
            ", optionally #json-key); give the secret's ARN, never its value.",
        )
    if sep and not _JSON_KEY.fullmatch(json_key):
        raise _fail(key, f"the JSON key after '#' must be 1 to {MAX_JSON_KEY} printable ASCII characters.")
    if not secret_prefix:
        raise _fail(key, "UPSTREAM_SECRET_PREFIX is empty, so no secret is allowed.", SECRET_NOT_ALLOWED)
    if not match.group("name").startswith(secret_prefix):
        raise _fail(
            key,
            f"secret {match.group('name')!r} is not under the allowed prefix {secret_prefix!r}.",
            SECRET_NOT_ALLOWED,
        )
    if region is not None and match.group("region") != region:
        raise _fail(
            key,
            f"secret {match.group('name')!r} is in region {match.group('region')}; this deployment reads secrets "
            f"in {region} only.",
            SECRET_NOT_ALLOWED,
        )
    return SecretRef(arn, json_key if sep else None)


def _check_secret_headers(value: object, ctx: _Context) -> tuple[tuple[str, SecretRef], ...]:
    return tuple(
        (_check_header_name("secret_headers", name), parse_secret_ref(ref, ctx.secret_prefix, header=name, region=ctx.region))
        for name, ref in _mapping("secret_headers", value).items()
    )


def _check_subprotocols(value: object, ctx: _Context) -> tuple[str, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_SUBPROTOCOLS:
        raise _fail("subprotocols", f"must be a list of 1 to {MAX_SUBPROTOCOLS} subprotocol names.")
    for name in value:
        if not isinstance(name, str) or not _TOKEN.fullmatch(name) or len(name) > MAX_HEADER_NAME:
            raise _fail("subprotocols", f"{_clip(name)!r} is not a subprotocol name (an HTTP token).")
    if len(set(value)) != len(value):
        raise _fail("subprotocols", "lists a subprotocol twice.")
    return tuple(value)


def _check_open_message(value: object, ctx: _Context) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_OPEN_MESSAGE:
        raise _fail("open_message", f"must be a string of 1 to {MAX_OPEN_MESSAGE} characters.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _fail("open_message", "must be valid Unicode (it has half of a surrogate pair).") from None
    return value


def _pointer(key: str, value: object) -> Pointer:
    try:
        return Pointer.parse(value)
    except PointerError as exc:
        raise _fail(key, str(exc)) from None


def _check_seq_pointer(value: object, ctx: _Context) -> Pointer:
    pointer = _pointer("seq_pointer", value)
    if pointer.is_whole:
        raise _fail("seq_pointer", 'must point into the frame ("" is the whole frame, which is not a seq).')
    return pointer


def _check_data_pointer(value: object, ctx: _Context) -> Pointer:
    return _pointer("data_pointer", value)


def _check_resume(value: object, ctx: _Context) -> Resume:
    try:
        return Resume(value)
    except ValueError:
        raise _fail("resume", f"must be one of {', '.join(r.value for r in Resume)}, got {_clip(value)!r}.") from None


MAX_SECRET_QUERY = 8
# A secret query parameter's name: URL-unreserved characters, so that it needs no encoding.
_QUERY_NAME = re.compile(r"[A-Za-z0-9._~-]{1,128}")
_RESERVED_QUERY = frozenset({"from_seq"})  # the worker's own parameter (resume: query)


def _check_secret_query(value: object, ctx: _Context) -> tuple[tuple[str, SecretRef], ...]:
    if not isinstance(value, dict) or not 1 <= len(value) <= MAX_SECRET_QUERY:
        raise _fail("secret_query", f"must be an object of 1 to {MAX_SECRET_QUERY} query parameter names to secret ARNs.")
    out = []
    for name, ref in value.items():
        if not isinstance(name, str) or not _QUERY_NAME.fullmatch(name):
            raise _fail(
                "secret_query", f"parameter name {_clip(name)!r} must be 1 to 128 of A-Z, a-z, 0-9, '.', '_', '~' or '-'."
            )
        if name.lower() in _RESERVED_QUERY:
            raise _fail("secret_query", f"parameter {name} is the worker's own (the resume point).")
        out.append((name, parse_secret_ref(ref, ctx.secret_prefix, "secret_query", header=name, region=ctx.region)))
    return tuple(out)


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
        _check_resume,
        tuple(r.value for r in Resume),
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
        _check_secret_query,
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
    parsed = {f.key: f.check(value[f.key], ctx) for f in FIELDS if f.key in value}
    plain = {name.lower() for name, _ in parsed.get("headers", ())}
    for name, _ in parsed.get("secret_headers", ()):
        if name.lower() in plain:
            raise _fail("secret_headers", f"header {name} is also in headers; give it once.")
    for key in ("headers", "secret_headers"):
        names = [name.lower() for name, _ in parsed.get(key, ())]
        if len(set(names)) != len(names):
            raise _fail(key, "names a header twice (header names are case-insensitive).")
    if len(parsed.get("headers", ())) + len(parsed.get("secret_headers", ())) > MAX_HEADERS:
        raise Invalid(INVALID, f"upstream: at most {MAX_HEADERS} headers and secret_headers together.")
    upstream = Upstream(**parsed)
    if upstream.resume is Resume.OPEN_MESSAGE and FROM_SEQ not in (upstream.open_message or ""):
        raise _fail("resume", "open_message resumes only through an open_message that contains {from_seq}.")
    return upstream


# --- the README's table ------------------------------------------------------------------


def markdown_table() -> str:
    """The README's table of the ``upstream`` keys and their limits, from :data:`FIELDS`
    (a test fails when the README's copy differs)."""

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
