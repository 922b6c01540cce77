"""What the two record sinks share, the Kinesis stream (:mod:`.kinesis`) and the Firehose
delivery stream (:mod:`.firehose`): a frame's record with its large data's pointer,
requests cut within a service's limits, and the loop that sends one request's records
until every one is acknowledged. Each sink keeps what is its own: how records are
packed, and which records a partial refusal sends again."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from .. import metrics_names as names
from .. import records
from ..store.base import TransientError, is_transient, retry_pause_s, unwrap_refusal
from ..stream import Frame
from .objects import StoredObject, needs_object
from .sink import InvalidItem

T = TypeVar("T")
Count = Callable[[str, int], None]


def frame_record(
    connection_id: str, fence_token: int, worker_id: str, frame: Frame, objects: Mapping[tuple[str, int], StoredObject] | None
) -> bytes:
    """A frame's record (:func:`wsfleet.records.encode`), large data by the pointer to the
    object already stored for it; a frame the encoder refuses is :class:`InvalidItem`."""
    ref = None
    if needs_object(frame):
        stored = (objects or {}).get((connection_id, frame.seq))
        if stored is None:  # a bug of the caller's: never a record that points at nothing
            raise ValueError(f"{connection_id} seq {frame.seq}: large data sent before its object was stored")
        ref = (stored.ref, stored.size, stored.sha256)
    try:
        return records.encode(connection_id, fence_token, worker_id, frame, data_ref=ref)
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError (a lone surrogate) is a ValueError
        raise InvalidItem(f"{connection_id} seq {frame.seq}: {type(exc).__name__}: {exc}") from exc


def requests(items: Iterable[T], size: Callable[[T], int], *, max_records: int, max_bytes: int) -> Iterator[list[T]]:
    """``items`` in order, cut into requests of at most ``max_records`` and ``max_bytes``."""
    request: list[T] = []
    total = 0
    for item in items:
        n = size(item)
        if request and (len(request) >= max_records or total + n > max_bytes):
            yield request
            request, total = [], 0
        request.append(item)
        total += n
    if request:
        yield request


class LockedCount:
    """``count(name, n)`` called under a lock of its own, from the pool threads that run
    the sinks' calls, and not at all for no count or nothing to add."""

    def __init__(self, count: Count | None) -> None:
        self._count = count
        self._lock = threading.Lock()

    def __call__(self, name: str, n: int) -> None:
        if self._count is not None and n:
            with self._lock:
                self._count(name, n)


@dataclass(frozen=True)
class Service:
    """How a record service answers: its put operation's name, what it is called in an
    error, the code of a request it refuses as invalid, and the codes that mean it is at
    its throughput."""

    operation: str
    what: str
    invalid_code: str
    throughput_codes: frozenset[str]


def put_until_acknowledged(
    service: Service,
    pending: list[T],
    send: Callable[[list[T]], Sequence[Mapping[str, Any]]],
    refused: Callable[[list[T], Sequence[Mapping[str, Any]]], list[T]],
    *,
    rounds: int,
    sleep: Callable[[float], None],
    add: Count,
) -> None:
    """``pending``'s records, sent (``send`` answers one result per record) until every one
    is acknowledged, or until ``rounds`` rounds in a row acknowledged nothing more
    (:class:`TransientError`). A round that made progress does not count. After a partial
    refusal ``refused`` says what goes again (counted in ``RecordsResent``); throughput
    refusals are counted in ``RecordsThrottled``, each round followed by a jittered
    backoff. A whole request that fails may have been applied (a lost answer): it goes
    again whole. Our own send-deadline refusal is raised as it is; a request the service
    refuses as invalid is :class:`InvalidItem`; any other error that is not transient
    nor the service's throughput is raised as it is (the writer's supervisor backs off)."""
    attempt = 0  # rounds in a row with no progress
    while attempt < rounds:
        try:
            answers = send(pending)
        except (ClientError, BotoCoreError) as exc:
            if deadline := unwrap_refusal(exc):
                raise deadline from None  # past its deadline: a retry here would be refused too
            code = error_code(exc)
            if code == service.invalid_code:  # a record the service will not take (we check first)
                raise InvalidItem(str(exc)) from exc
            if not is_transient(exc) and code not in service.throughput_codes:
                raise
            if code in service.throughput_codes:
                add(names.RECORDS_THROTTLED, len(pending))
            sleep(retry_pause_s(attempt))
            attempt += 1
            continue
        if len(answers) != len(pending):
            raise TransientError(f"{service.operation} answered {len(answers)} results for {len(pending)} records")
        again = refused(pending, answers)
        if not again:
            return
        add(names.RECORDS_RESENT, len(again))
        add(names.RECORDS_THROTTLED, sum(a.get("ErrorCode") in service.throughput_codes for a in answers))
        attempt = 0 if len(again) < len(pending) else attempt + 1
        pending = again
        sleep(retry_pause_s(attempt))
    raise TransientError(f"{len(pending)} records still refused by the {service.what} after {rounds} rounds")


def error_code(exc: BaseException) -> str:
    return exc.response.get("Error", {}).get("Code", "") if isinstance(exc, ClientError) else ""
