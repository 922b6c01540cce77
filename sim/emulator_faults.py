"""The emulator's fault switch (``/_wsfleet/faults``): DynamoDB throttling, latency and
outages, SQS, Secrets Manager and Kinesis outages, ambiguous requests, Kinesis
throttling and partly refused PutRecords; see :mod:`sim.emulator` for the
setting's keys."""

from __future__ import annotations

import json
import random
import threading
import time
import io
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from .emulator_wsgi import WSGIApp
from .emulator_wsgi import answer_of as _answer_of
from .emulator_wsgi import aws_error as _aws_error
from .emulator_wsgi import json_response as _json
from .emulator_wsgi import operation as _operation
from .emulator_wsgi import read_body as _read_body
from .emulator_wsgi import service as _service

FAULTS_PATH = "/_wsfleet/faults"
# In a client's User-Agent (botocore ``user_agent_extra``): the fleet runner's own reads,
# never faulted.
HARNESS_MARK = "wsfleet-harness"
OUTAGE_SERVICES = ("dynamodb", "sqs", "secretsmanager", "kinesis", "firehose")
# The ones whose writes matter to ownership or delivery.
AMBIGUOUS_SERVICES = ("dynamodb", "sqs", "kinesis", "firehose")
# Kinesis and Firehose take throttling and ambiguity only by operation name
# ("PutRecords", "PutRecordBatch"), never under "*": a setting written for DynamoDB
# keeps meaning what it meant.
BY_NAME_ONLY = frozenset({"kinesis", "firehose"})
THROTTLED_SERVICES = ("dynamodb", "kinesis", "firehose")
PUT_RECORDS = "PutRecords"
PUT_RECORD_BATCH = "PutRecordBatch"
THROUGHPUT_EXCEEDED = "ProvisionedThroughputExceededException"
# A delivery stream over its throughput answers this, whole or per record.
FIREHOSE_UNAVAILABLE = "ServiceUnavailableException"
# Per batch operation: (its records' key in the request, its failed count's key and its
# results' key in the answer, the per-record refusal).
_BATCHES = {
    PUT_RECORDS: ("Records", "FailedRecordCount", "Records", THROUGHPUT_EXCEEDED),
    PUT_RECORD_BATCH: ("Records", "FailedPutCount", "RequestResponses", FIREHOSE_UNAVAILABLE),
}


def _shares(value: float | Mapping[str, float], what: str, top: float) -> dict[str, float]:
    """A number for every operation, or numbers by operation with ``*`` for the rest;
    zeros dropped. Raises ValueError naming ``what`` on a value outside 0..top."""
    shares = {"*": value} if isinstance(value, (int, float)) else dict(value)
    for op, share in shares.items():
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= top:
            raise ValueError(f"{what} of {op!r} must be a number from 0 to {top:g}, got {share!r}")
    return {op: float(share) for op, share in shares.items() if share}


@dataclass(frozen=True)
class FaultSetting:
    """What :class:`Faults` does, as POSTed (see the module docstring)."""

    throttle: Mapping[str, float] = field(default_factory=dict)  # share by operation, "*": the rest
    latency_ms: Mapping[str, float] = field(default_factory=dict)  # added delay by operation
    jitter_ms: float = 0.0  # up to this much more, at random
    outage: Mapping[str, float] = field(default_factory=dict)  # service -> seconds, from when it was set
    outage_mode: str = "error"  # error | hang (DynamoDB only)
    ambiguous: Mapping[str, float] = field(default_factory=dict)  # share applied then answered 500, by operation
    refuse_records: float = 0.0  # share of a PutRecords' records refused for throughput (the rest applied)
    seed: int | None = None

    @classmethod
    def parse(cls, spec: Mapping[str, Any]) -> "FaultSetting":
        if not isinstance(spec, Mapping):
            raise ValueError("the fault setting must be a JSON object")
        unknown = set(spec) - {
            "throttle", "latency_ms", "jitter_ms", "outage", "outage_mode", "ambiguous", "refuse_records", "seed"
        }
        if unknown:
            raise ValueError(f"unknown fault settings: {', '.join(sorted(unknown))}")
        outage = spec.get("outage") or {}
        if not isinstance(outage, Mapping) or not set(outage) <= set(OUTAGE_SERVICES):
            raise ValueError(f"outage must map some of {', '.join(OUTAGE_SERVICES)} to seconds")
        mode = spec.get("outage_mode", "error")
        if mode not in ("error", "hang"):
            raise ValueError(f"outage_mode must be error or hang, got {mode!r}")
        jitter = spec.get("jitter_ms", 0)
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter <= 60_000:
            raise ValueError(f"jitter_ms must be a number from 0 to 60000, got {jitter!r}")
        refuse = spec.get("refuse_records", 0)
        if isinstance(refuse, bool) or not isinstance(refuse, (int, float)) or not 0 <= refuse <= 1:
            raise ValueError(f"refuse_records must be a number from 0 to 1, got {refuse!r}")
        return cls(
            throttle=_shares(spec.get("throttle", 0), "throttle share", 1),
            latency_ms=_shares(spec.get("latency_ms", 0), "latency_ms", 60_000),
            jitter_ms=float(jitter),
            outage=_shares(outage, "outage seconds", 3600),
            outage_mode=mode,
            ambiguous=_shares(spec.get("ambiguous", 0), "ambiguous share", 1),
            refuse_records=float(refuse),
            seed=spec.get("seed"),
        )


class Faults:
    """WSGI middleware: DynamoDB throttling, added latency and outages, SQS outages, and
    ambiguous requests of both, switched at run time through ``FAULTS_PATH`` (see the
    module docstring). Requests marked with :data:`HARNESS_MARK` pass untouched."""

    def __init__(self, app: WSGIApp) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._setting = FaultSetting()
        self._outage_until: dict[str, float] = {}  # service -> monotonic end
        self._rng = random.Random()
        self._counts: dict[str, Counter[str]] = {
            k: Counter() for k in ("throttled", "delayed", "failed", "ambiguous", "passed", "records_refused")
        }

    def set(self, setting: FaultSetting) -> None:
        """Replace the setting; resets the counts."""
        now = time.monotonic()
        with self._lock:
            self._setting = setting
            self._outage_until = {service: now + s for service, s in setting.outage.items()}
            self._rng = random.Random(setting.seed)
            for counter in self._counts.values():
                counter.clear()

    def state(self) -> dict[str, Any]:
        now = time.monotonic()
        with self._lock:
            s = self._setting
            return {
                "throttle": dict(s.throttle), "latency_ms": dict(s.latency_ms), "jitter_ms": s.jitter_ms,
                "outage": dict(s.outage), "outage_mode": s.outage_mode, "ambiguous": dict(s.ambiguous),
                "refuse_records": s.refuse_records, "seed": s.seed,
                "outage_left_s": {k: round(end - now, 3) for k, end in self._outage_until.items() if end > now},
                **{name: dict(counter) for name, counter in self._counts.items()},
            }

    def _decide(self, service: str, op: str) -> tuple[str, float, bool]:
        """(what to do, seconds, lose the answer): ("outage", until, False) |
        ("throttle", 0, False) | ("delay", s, ambiguous) | ("pass", 0, ambiguous). An
        ambiguous request is counted once its answer is known (:meth:`_lose_answer`)."""
        with self._lock:
            s = self._setting
            until = self._outage_until.get(service, 0.0)
            if until > time.monotonic():
                self._counts["failed"][op] += 1
                return "outage", until, False
            delay = 0.0
            every = 0.0 if service in BY_NAME_ONLY else None  # the "*" share, where it applies
            if service in THROTTLED_SERVICES:
                share = s.throttle.get(op, s.throttle.get("*", 0.0) if every is None else every)
                if share > 0 and self._rng.random() < share:
                    self._counts["throttled"][op] += 1
                    return "throttle", 0.0, False
            if service == "dynamodb":
                delay = s.latency_ms.get(op, s.latency_ms.get("*", 0.0))
                if delay > 0 or s.jitter_ms > 0:
                    delay += s.jitter_ms * self._rng.random()
            share = (
                s.ambiguous.get(op, s.ambiguous.get("*", 0.0) if every is None else every)
                if service in AMBIGUOUS_SERVICES
                else 0.0
            )
            ambiguous = share > 0 and self._rng.random() < share
            if service in THROTTLED_SERVICES and not ambiguous:
                self._counts["delayed" if delay > 0 else "passed"][op] += 1
            return ("delay", delay / 1000, ambiguous) if delay > 0 else ("pass", 0.0, ambiguous)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == FAULTS_PATH:
            return self._control(environ, start_response)
        service = _service(environ)
        op = _operation(environ) or environ.get("HTTP_X_AMZ_TARGET", "").rpartition(".")[2] or service
        if service not in OUTAGE_SERVICES or HARNESS_MARK in environ.get("HTTP_USER_AGENT", ""):
            return self._app(environ, start_response)
        what, value, ambiguous = self._decide(service, op)
        if what == "delay":
            time.sleep(value)  # before the DynamoDB lock is taken: others go on meanwhile
        if what in ("pass", "delay"):
            if ambiguous:
                return self._lose_answer(environ, start_response, service, op, delayed=what == "delay")
            if service in ("kinesis", "firehose") and op in _BATCHES and self._setting.refuse_records > 0:
                return self._refuse_some(environ, start_response, op)
            return self._app(environ, start_response)
        _read_body(environ)  # a client sending a body expects it to be read
        if what == "throttle" and service == "kinesis":
            return self._error(start_response, "400 Bad Request", THROUGHPUT_EXCEEDED,
                               "Rate exceeded for the stream's shards.")
        if what == "throttle" and service == "firehose":
            return self._error(start_response, "503 Service Unavailable", FIREHOSE_UNAVAILABLE,
                               "Slow down (an emulator fault).")
        if what == "throttle":
            return self._error(start_response, "400 Bad Request", "com.amazonaws.dynamodb.v20120810#ThrottlingException",
                               "Rate of requests exceeds the allowed throughput.")
        if service == "sqs":
            return self._error(start_response, "503 Service Unavailable", "com.amazonaws.sqs#ServiceUnavailable",
                               "The request has failed due to a temporary failure of the server.")
        if self._setting.outage_mode == "hang":
            time.sleep(max(0.0, value - time.monotonic()))
        return self._internal_error(start_response, service)

    def _lose_answer(
        self, environ: dict, start_response: Callable, service: str, op: str, *, delayed: bool
    ) -> Iterable[bytes]:
        """Apply the request, then answer a 500 in place of what the service answered,
        as when a response is lost on the way back. A request the service refused was
        not applied: it keeps its own answer (and is counted as delayed or passed)."""
        status, headers, body = _answer_of(self._app, environ)  # the whole answer: the write is done
        applied = status.startswith("2")
        if applied or service in THROTTLED_SERVICES:
            with self._lock:
                self._counts["ambiguous" if applied else "delayed" if delayed else "passed"][op] += 1
        if applied:
            return self._internal_error(start_response, service)
        start_response(status, headers)
        return [body]

    def _refuse_some(self, environ: dict, start_response: Callable, op: str) -> Iterable[bytes]:
        """A PutRecords (PutRecordBatch) of which ``refuse_records`` of the records (picked
        at random) are refused for throughput, per record, as a shard (a delivery stream)
        at its limit does: the others alone go on to the stream, and the answer has every
        record's result in its place. A body that is not one goes on untouched, for moto
        to answer."""
        records_key, failed_key, results_key, refusal = _BATCHES[op]
        raw = _read_body(environ)
        try:
            request = json.loads(raw)
            recs = request[records_key]
            if not isinstance(recs, list) or not recs:
                raise ValueError("no records")
        except (ValueError, KeyError, TypeError):
            return self._app(environ, start_response)
        with self._lock:
            share = self._setting.refuse_records
            refused = {i for i in range(len(recs)) if self._rng.random() < share}
            self._counts["records_refused"][op] += len(refused)
        if not refused:
            return self._app(environ, start_response)
        kept = [r for i, r in enumerate(recs) if i not in refused]
        answers: list[dict] = []
        if kept:
            body = json.dumps({**request, records_key: kept}).encode()
            environ["wsgi.input"] = io.BytesIO(body)
            environ["CONTENT_LENGTH"] = str(len(body))
            status, _, out = _answer_of(self._app, environ)
            if not status.startswith("2"):  # refused whole (no such stream, ...): its own answer
                return self._error(start_response, status, *_kind_and_message(out))
            answers = json.loads(out)[results_key]
        placed = iter(answers)
        results = [
            {"ErrorCode": refusal, "ErrorMessage": "Rate exceeded (an emulator fault)."}
            if i in refused
            else next(placed)
            for i in range(len(recs))
        ]
        return _json("200 OK", {failed_key: len(refused), results_key: results}, start_response)

    def _internal_error(self, start_response: Callable, service: str) -> list[bytes]:
        if service == "secretsmanager":
            return self._error(start_response, "500 Internal Server Error", "InternalServiceError",
                               "An error occurred on the server side.")
        if service == "sqs":
            return self._error(start_response, "500 Internal Server Error", "com.amazonaws.sqs#InternalError",
                               "We encountered an internal error. Please try again.")
        if service in ("kinesis", "firehose"):
            return self._error(start_response, "500 Internal Server Error", "InternalFailure",
                               "The server encountered an internal error.")
        return self._error(start_response, "500 Internal Server Error", "com.amazonaws.dynamodb.v20120810#InternalServerError",
                           "Internal server error")

    def _error(self, start_response: Callable, status: str, kind: str, message: str) -> list[bytes]:
        return _aws_error(start_response, status, kind, message)

    def _control(self, environ: dict, start_response: Callable) -> list[bytes]:
        if environ.get("REQUEST_METHOD") == "POST":
            try:
                self.set(FaultSetting.parse(json.loads(_read_body(environ) or b"{}")))
            except (ValueError, AttributeError, TypeError) as exc:
                return _json("400 Bad Request", {"error": "bad_request", "message": str(exc)}, start_response)
        return _json("200 OK", self.state(), start_response)


def _kind_and_message(body: bytes) -> tuple[str, str]:
    """An AWS JSON error body's type and message (for an answer passed on as it was)."""
    try:
        doc = json.loads(body)
        return str(doc.get("__type", "InternalFailure")), str(doc.get("message", doc.get("Message", "")))
    except (ValueError, AttributeError):
        return "InternalFailure", body.decode("utf-8", "replace")
