"""The one visible place where the worker's blocking boto3 calls leave the event loop.

boto3 is synchronous. Every call the worker makes goes through :meth:`Aws.call`, which
runs it in a bounded thread pool, so the loop that drives a thousand sockets never
blocks on the network. SQS long polls get a pool of their own, so that a 10-second
poll never holds a thread that a lease renewal needs.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
from collections import Counter
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, TypeVar

import boto3
from botocore.config import Config

from . import clock, schema, tracing
from .config import WorkerConfig
from .store import TransientError

T = TypeVar("T")

SQS_WAIT_SECONDS = 10
SETTLE_WAIT_S = 5.0  # how long a poll's thread waits for the loop to take its result
URGENT_THREADS = 4  # the session renewal's own lane: retries may overlap slow tries (read timeout 5 s)

_send_deadline = threading.local()


class SendDeadlinePassed(TransientError):
    """A DynamoDB, S3 or Kinesis request was about to leave after its caller's lease deadline."""


@contextmanager
def send_deadline(deadline_mono: float | Callable[[], float]) -> Iterator[None]:
    """In this thread, refuse to send DynamoDB, S3 and Kinesis requests once the deadline (:func:`wsfleet.clock.now`) has
    passed, checked as late as Python can (a callable deadline is read afresh at each
    check: a store that retries inside one call, as the Kinesis sink does for several
    rounds, goes on while renewals move the lease on, and stops the moment it is lost): right before each ``sendall`` of the request's
    bytes, once its connection is made (an S3 upload's body is checked again as it
    leaves, after the ``100-continue`` wait).

    Message writes and object uploads are not conditional, so this is what keeps a worker that was frozen
    (SIGSTOP, a long GC or VM pause) between deciding to write and sending from writing
    after its lease ran out: the check runs after the freeze, not before it. Two checks:
    botocore's ``before-send`` hook refuses before a connection is even taken, and an
    audit hook on ``http.client.send`` refuses after the connect (the emulator closes
    every connection, so each request connects anew) and after any wait for the GIL on
    the way. What is left is the few bytecodes between that hook and the system call;
    ``python -m bench pauses`` measures how often a frozen writer still lands a batch."""
    _send_deadline.value = deadline_mono
    try:
        yield
    finally:
        _send_deadline.value = None


def _refuse_after_deadline(**_: Any) -> None:
    deadline = getattr(_send_deadline, "value", None)
    if callable(deadline):
        deadline = deadline()
    if deadline is not None and clock.now() >= deadline:
        raise SendDeadlinePassed("lease deadline passed before the request was sent")


def _refuse_at_the_socket(event: str, _args: tuple) -> None:
    """An audit hook: http.client raises ``http.client.send`` right before each
    ``sock.sendall``, plain or TLS, in the thread that sends. Raising aborts the send;
    botocore hands the caller an HTTPClientError whose ``error`` is the refusal (see
    :func:`wsfleet.store.unwrap_refusal`), and the half-sent connection is discarded."""
    if event == "http.client.send":
        _refuse_after_deadline()


@functools.cache
def _install_socket_check() -> None:
    """Once per process: audit hooks cannot be removed, and one is enough (two, from a
    race of the first calls, would only check twice)."""
    sys.addaudithook(_refuse_at_the_socket)


def span_name(fn: Callable[..., Any]) -> str:
    """What a span of this call is called: a boto3 client's operation as
    ``<service>.<operation>`` (its methods are all one closure, so their qualified name
    says nothing), a function of ours by its qualified name."""
    qualname = getattr(fn, "__qualname__", "") or "aws_call"
    if "<locals>" not in qualname:
        return qualname
    try:
        service = fn.__self__.meta.service_model.service_name  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - not a client's method: its own name will do
        service = ""
    name = getattr(fn, "__name__", "") or "aws_call"
    return f"{service}.{name}" if service else name


class Aws:
    def __init__(
        self, config: WorkerConfig, *, threads: int = 32, session: boto3.session.Session | None = None
    ) -> None:
        session = session or boto3.session.Session(region_name=config.region)
        base = dict(max_pool_connections=threads + URGENT_THREADS, connect_timeout=2)
        # One attempt per DynamoDB call: the worker retries transient failures itself
        # (wsfleet.worker.retry), with backoff bounded by the lease deadline. botocore's
        # own retries would sleep up to seconds inside a call, past a short lease.
        # total_max_attempts counts the first try; standard mode's max_attempts would
        # still allow one retry, slowing the renewal's own retry cadence.
        once = dict(read_timeout=5, retries={"mode": "standard", "total_max_attempts": 1}, **base)
        self.dynamodb = session.client("dynamodb", endpoint_url=config.endpoint_url, config=Config(**once))
        # Message writes, the worker's hottest request, go through a client of their own
        # that skips botocore's parameter validation (~0.6 ms of CPU per BatchWriteItem,
        # 0.07 ms per message at 100 x 2 msg/s): their items are built by MessagesStore
        # from typed values, and DynamoDB validates them again. Every other request keeps
        # the client-side check. Same timeouts, retries and hooks.
        self.dynamodb_writes = session.client(
            "dynamodb", endpoint_url=config.endpoint_url, config=Config(parameter_validation=False, **once)
        )
        # Large message data (wsfleet.sinks.objects): one attempt, retried by the worker
        # like the message writes, under the same deadline checks. The read timeout is
        # per socket operation, not per upload, so 32 MiB bodies fit it.
        self.s3 = session.client("s3", endpoint_url=config.endpoint_url, config=Config(**once))
        # The messages stream (SINK has kinesis; None otherwise): PutRecords, one attempt,
        # retried by the sink and the worker under the same deadline checks. No client-side
        # validation, as for the table's writes: StreamSink builds the records itself (and
        # checks the limits that matter), and Kinesis validates them again.
        self.kinesis = (
            session.client("kinesis", endpoint_url=config.endpoint_url, config=Config(parameter_validation=False, **once))
            if schema.SINK_KINESIS in config.sinks
            else None
        )
        # The delivery stream (SINK has firehose; None otherwise): PutRecordBatch, the same
        # rules as the stream's (DeliverySink builds and checks its records itself).
        self.firehose = (
            session.client("firehose", endpoint_url=config.endpoint_url, config=Config(parameter_validation=False, **once))
            if schema.SINK_FIREHOSE in config.sinks
            else None
        )
        retried = dict(retries={"mode": "standard", "max_attempts": 3}, **base)
        self.sqs = session.client(
            "sqs", endpoint_url=config.endpoint_url, config=Config(read_timeout=SQS_WAIT_SECONDS + 10, **retried)
        )
        # Secret header values for upstream handshakes (wsfleet.worker.secrets), retried
        # by botocore: a fetch is not bound to a lease deadline, and a socket waits for it.
        self.secretsmanager = session.client(
            "secretsmanager", endpoint_url=config.endpoint_url, config=Config(read_timeout=5, **retried)
        )
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="aws")
        # The session renewal never queues behind a burst of acquisitions or message
        # writes: every connection the worker holds depends on it.
        self._urgent = ThreadPoolExecutor(URGENT_THREADS, thread_name_prefix="aws-urgent")
        # Requests as sent on the wire (retries included), per "service.Operation": what
        # the bill and the cost benchmark count.
        self.requests: Counter[str] = Counter()
        for client in (*self.dynamodb_clients, self.s3, self.sqs, self.secretsmanager):
            client.meta.events.register("request-created", self._count)
        for client in self.dynamodb_clients:
            client.meta.events.register("before-send.dynamodb", _refuse_after_deadline)
        self.s3.meta.events.register("before-send.s3", _refuse_after_deadline)
        for stream, service in ((self.kinesis, "kinesis"), (self.firehose, "firehose")):
            if stream is not None:
                stream.meta.events.register("request-created", self._count)
                stream.meta.events.register(f"before-send.{service}", _refuse_after_deadline)
        _install_socket_check()

    @property
    def dynamodb_clients(self) -> tuple[Any, Any]:
        """Both DynamoDB clients: for a hook that must see every DynamoDB request."""
        return self.dynamodb, self.dynamodb_writes

    def _count(self, event_name: str = "", **_: Any) -> None:
        # "request-created.<service>.<Operation>", emitted once per attempt.
        self.requests[event_name.partition(".")[2]] += 1

    async def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run a blocking call in the pool. Cancelling the await does not stop the
        thread: the request may still land, which every write we make tolerates
        (renewals and message writes are idempotent; acquire and release recognise a
        retry of a write that landed)."""
        return await self._run(self._pool, fn, args, kwargs)

    async def call_urgent(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """:meth:`call` in a lane of its own, for the session renewal alone."""
        return await self._run(self._urgent, fn, args, kwargs)

    async def _run(self, pool: ThreadPoolExecutor, fn: Callable[..., T], args: Any, kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        with tracing.subsegment(span_name(fn)):
            return await loop.run_in_executor(pool, functools.partial(fn, *args, **kwargs))

    async def poll(
        self,
        fn: Callable[..., T],
        /,
        *args: Any,
        on_abandoned: Callable[[T], None] | None = None,
        **kwargs: Any,
    ) -> T:
        """Run a long poll in a daemon thread of its own: it never takes a pool thread
        from a lease renewal, and a poll in flight at exit does not hold the process.
        A result that nobody takes any more (its awaiter was cancelled, the loop is
        closed or does not answer within ``SETTLE_WAIT_S``) goes to ``on_abandoned``
        in that thread, so that the messages it received are given back at once instead
        of staying invisible for their visibility timeout."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        decided = threading.Event()
        claim = threading.Lock()  # the first of the loop and the thread to take it has the result

        def take() -> bool:
            return claim.acquire(blocking=False)

        def settle(result: Any, exc: BaseException | None) -> None:
            if not future.done():  # else cancelled: the thread gives it back
                if not take():
                    future.set_exception(TransientError("the poll's result was given back: the loop was too slow"))
                elif exc is not None:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            decided.set()

        def work() -> None:
            try:
                result, exc = fn(*args, **kwargs), None
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
                result, exc = None, e
            try:
                loop.call_soon_threadsafe(settle, result, exc)
                decided.wait(SETTLE_WAIT_S)
            except RuntimeError:
                pass  # the loop is closed: nobody is waiting any more
            if take() and exc is None and on_abandoned is not None:
                try:
                    on_abandoned(result)
                except Exception:  # noqa: BLE001 - what cannot be given back reappears after its timeout
                    pass

        threading.Thread(target=work, name="sqs-poll", daemon=True).start()
        return await future

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._urgent.shutdown(wait=False, cancel_futures=True)
