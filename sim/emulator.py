"""A local AWS emulator: moto in server mode on loopback, with DynamoDB made atomic.

moto applies a conditional write as "read, check, write" without a lock, so two
concurrent requests can both pass the check (two winners of one lease, lost fence
increments). Real DynamoDB serialises writes per item. We restore that guarantee by
serialising every DynamoDB request inside the server, and every Kinesis request (its
PutRecords races the same way: two records given one sequence number, one of them
lost) under a lock of its own; other services (SQS long polls above all) stay
concurrent.

Three paths of its own, beside the AWS APIs, for the benchmarks and chaos runs:

* ``/_wsfleet/faults``: fault injection, switched at run time. ``POST`` a setting, which
  replaces the previous one whole (a key left out is off):

  - ``{"throttle": 0.5, "seed": 7}`` answers half of all DynamoDB requests, picked at
    random, with DynamoDB's own ``ThrottlingException`` (HTTP 400); ``{"throttle":
    {"UpdateItem": 0.9, "*": 0.1}}`` sets shares per operation (``*``: every other one);
  - ``{"latency_ms": 200, "jitter_ms": 100}`` delays every DynamoDB request by 200-300 ms
    before it is handled (per operation too, as a mapping), outside the lock that
    serialises DynamoDB, so a slow request does not hold the others up;
  - ``{"outage": {"dynamodb": 8, "sqs": 5}}`` fails every request to that service for
    that many seconds from now: DynamoDB with ``InternalServerError`` (HTTP 500), SQS
    with ``ServiceUnavailable`` (HTTP 503), Secrets Manager (``"secretsmanager"``, the
    only fault it takes) with ``InternalServiceError`` (HTTP 500), Kinesis (``"kinesis"``)
    with ``InternalFailure`` (HTTP 500); with ``"outage_mode": "hang"`` a DynamoDB
    request is held until the outage ends, then failed, as a black-holed network does;
  - ``{"ambiguous": {"UpdateItem": 0.5, "TransactWriteItems": 1, "*": 0.1}, "seed": 7}``
    makes that share of requests *ambiguous*: the request is applied as usual (DynamoDB
    inside the lock that serialises it, journal included; an SQS message is sent, or
    received and hidden), then its answer is replaced by an HTTP 500
    (``InternalServerError``; SQS: ``InternalError``), which the SDKs retry as they would
    a timeout. ``*`` covers every other operation of both services. A request the service
    refused (a failed condition, say) was not applied, and keeps its own answer. Kinesis
    is faulted by operation name only (never under ``*``): ``{"ambiguous": {"PutRecords":
    0.2}}`` applies that share of PutRecords and answers them ``InternalFailure`` (500);
  - ``{"throttle": {"PutRecords": 0.3}}`` refuses that share of PutRecords whole with
    Kinesis' ``ProvisionedThroughputExceededException`` (HTTP 400), nothing applied;
  - ``{"refuse_records": 0.1}``: a partial failure. Each record of a PutRecords is refused
    with that chance: the others are put on the stream, and the answer (200) gives the
    refused ones ``ErrorCode`` ``ProvisionedThroughputExceededException`` in their places,
    as a shard at its limit does;
  - Firehose (``"firehose"``) takes the same three by operation name, ``PutRecordBatch``:
    an outage and a lost answer as Kinesis' (``InternalFailure``), a throttle as
    ``ServiceUnavailableException`` (HTTP 503), and ``refuse_records`` per record with
    that ErrorCode in ``RequestResponses`` (``FailedPutCount`` the refused);

  ``{}`` switches everything off. ``GET`` answers the setting, the seconds of outage
  left, and per operation how many requests were failed (by an outage), throttled, made
  ambiguous, delayed and passed since the last POST: a DynamoDB or Kinesis request is
  counted once, under the first of these that applies; an SQS request only when failed
  or ambiguous; ``records_refused`` counts the PutRecords records refused one by one.
  Requests whose User-Agent carries :data:`.emulator_faults.HARNESS_MARK` (the fleet runner's own reads:
  its observer and its audit) are never faulted: the faults are for the system under
  test, the evidence must not depend on them.
* ``/_wsfleet/requests``: ``GET`` answers every DynamoDB request received so far,
  counted per operation, table, index and (for a Query) the partition key value, so
  that a benchmark can split its client's counts by table and index partition.
* ``/_wsfleet/journal``: an independent history of the writes that matter to ownership,
  in the order the serialised DynamoDB applied them. Off until ``POST {"record": true}``
  (which also clears it); then every message stored (BatchWriteItem puts: key, fence,
  writer), every acquisition (a TransactWriteItems Update that sets ``fence_token``, or
  an UpdateItem that answered an item with one: key, fence, session), every checkpoint
  and release (an Update that sets ``last_seq``: key, last_seq, fence; what a takeover
  resumes from, for the stream audit) and every UpdateItem that answered an ENDED
  session (who ended it) is recorded with its position and the server's clock. ``GET ?since=N``
  answers the entries from position N.

Run standalone with ``python -m sim.emulator`` (prints ``READY <url>``),
or embed with :class:`Emulator` in tests.

This module assembles the layers (:func:`build_app`) and runs the server; the layers
live beside it: :mod:`.emulator_faults` (the fault switch), :mod:`.emulator_books` (the
journal and the request ledger), :mod:`.moto_patches` and :mod:`.emulator_wsgi`; what a
client signs with is :mod:`.emulator_client`'s.
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
import sys
import threading
import time
import urllib.request
from typing import Any, Callable, Iterable, Mapping

from werkzeug.serving import make_server

from wsfleet import config, schema, settings_spec
from wsfleet.logs import route_stdlib_logging
from .emulator_books import JOURNAL_PATH, REQUESTS_PATH, Journal, RequestLedger
from .emulator_client import CREDENTIALS, DEFAULT_REGION, emulator_session
from .emulator_faults import FAULTS_PATH, Faults
from .emulator_partitions import PartitionWrites
from .emulator_wsgi import WSGIApp
from .emulator_wsgi import operation as _operation
from .emulator_wsgi import read_body as _read_body
from .moto_patches import (
    _batches_keep_system_attributes,
    _kinesis_sequence_ends_in_constant_time,
    _partition_queries,
    _transactions_copy_items_not_tables,
    _visible_again_wakes_long_polls,
)
from .secrets import SECRET_PREFIX



TABLE_NAME = "wsfleet-connections"
SESSIONS_TABLE_NAME = "wsfleet-sessions"
MESSAGES_TABLE_NAME = "wsfleet-messages"
MESSAGES_STREAM_NAME = "wsfleet-messages"
# The local stream's shards: more than one, so that readers meet a stream as AWS's
# on-demand streams are (4 shards at first), one connection's records in one of them.
STREAM_SHARDS = 2
MESSAGES_BUCKET_NAME = "wsfleet-messages"
# The delivery stream (SINK has firehose) and its bucket: moto writes each PutRecordBatch
# at once as one object under DELIVERY_PREFIX (no buffering, compression or dynamic
# partitioning: the lines are what the stacks' Firehose would store, unsplit and plain).
MESSAGES_DELIVERY_STREAM_NAME = "wsfleet-messages"
DELIVERY_BUCKET_NAME = "wsfleet-delivery"
DELIVERY_PREFIX = "frames/"
QUEUE_NAME = "wsfleet-start"
DEAD_LETTER_SUFFIX = "-dead"  # the START queue's dead-letter queue is named after it


_KINESIS_TARGET = "Kinesis_20131202."


class SerializedDynamoDB:
    """WSGI middleware: at most one DynamoDB request is handled at a time, and what it
    wrote is put in the :class:`Journal` (when recording) in that same order."""

    def __init__(self, app: WSGIApp, journal: "Journal | None" = None) -> None:
        self._app = app
        self._lock = threading.Lock()
        # Kinesis has its own: moto's PutRecords is not atomic either (two concurrent
        # requests can give two records one sequence number, and one is lost), and it
        # need not wait for DynamoDB's.
        self._kinesis_lock = threading.Lock()
        self._journal = journal

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        op = _operation(environ)
        if op is None:
            if environ.get("HTTP_X_AMZ_TARGET", "").startswith(_KINESIS_TARGET):
                with self._kinesis_lock:
                    return list(self._app(environ, start_response))
            return self._app(environ, start_response)
        journal = self._journal if self._journal is not None and self._journal.wants(op) else None
        if journal is None:
            with self._lock:
                # Materialise the body inside the lock: the write happens while moto
                # builds the response, not when the server sends it.
                return list(self._app(environ, start_response))
        request = _read_body(environ)
        status: list[str] = []

        def capture(code: str, headers: list, *exc: Any) -> Any:
            status.append(code)
            return start_response(code, headers, *exc)

        with self._lock:
            body = list(self._app(environ, capture))
            if status and status[0].startswith("200"):
                journal.record(op, request, b"".join(body))
        return body


def build_app(*, partition_writes_per_s: float = 0, partition_clock: Callable[[], float] = time.monotonic) -> WSGIApp:
    """moto behind the ledger (outermost: it sees every request), the journal's control
    path, the fault switch, each partition's write limit (:mod:`.emulator_partitions`,
    off at 0, its buckets refilled by ``partition_clock``) and the lock that serialises
    DynamoDB (and journals it)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    _partition_queries()
    _visible_again_wakes_long_polls()
    _transactions_copy_items_not_tables()
    _kinesis_sequence_ends_in_constant_time()
    _batches_keep_system_attributes()
    book = Journal()
    serialized = SerializedDynamoDB(DomainDispatcherApplication(create_backend_app), book)
    return RequestLedger(book(Faults(PartitionWrites(serialized, partition_writes_per_s, clock=partition_clock))))


def _post(url: str, body: Mapping[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def set_faults(
    endpoint_url: str,
    *,
    throttle: float | Mapping[str, float] = 0,
    latency_ms: float | Mapping[str, float] = 0,
    jitter_ms: float = 0,
    outage: Mapping[str, float] | None = None,
    outage_mode: str = "error",
    ambiguous: float | Mapping[str, float] = 0,
    refuse_records: float = 0,
    seed: int | None = None,
) -> dict[str, Any]:
    """Replace the emulator's fault setting (see :class:`Faults`; no argument: all off);
    returns its new state."""
    return _post(endpoint_url + FAULTS_PATH, {
        "throttle": throttle, "latency_ms": latency_ms, "jitter_ms": jitter_ms,
        "outage": dict(outage or {}), "outage_mode": outage_mode, "ambiguous": ambiguous,
        "refuse_records": refuse_records, "seed": seed,
    })


def faults(endpoint_url: str) -> dict[str, Any]:
    """The emulator's fault setting and counts since it was last set."""
    with urllib.request.urlopen(endpoint_url + FAULTS_PATH, timeout=10) as resp:
        return json.load(resp)


def record_journal(endpoint_url: str, record: bool = True) -> None:
    """Start (clearing it) or stop the emulator's write journal (see :class:`Journal`)."""
    _post(endpoint_url + JOURNAL_PATH, {"record": record})


def journal(endpoint_url: str) -> list[dict[str, Any]]:
    """Every journal entry recorded so far, in the order DynamoDB applied the writes."""
    out: list[dict[str, Any]] = []
    while True:
        with urllib.request.urlopen(f"{endpoint_url}{JOURNAL_PATH}?since={len(out)}", timeout=30) as resp:
            page = json.load(resp)
        out.extend(page["entries"])
        if not page["entries"] or len(out) >= page["total"]:
            return out


def request_ledger(endpoint_url: str) -> list[dict[str, Any]]:
    """Every DynamoDB request the emulator received so far (see :class:`RequestLedger`)."""
    with urllib.request.urlopen(endpoint_url + REQUESTS_PATH, timeout=10) as resp:
        return json.load(resp)["requests"]


FREEZE_EVERY_S = 2.0


def freeze_survivors(stop: threading.Event, every_s: float = FREEZE_EVERY_S) -> None:
    """Every ``every_s``, move every object alive to the garbage collector's permanent
    generation (``gc.freeze``, O(1)), so that a full collection only looks at what is new.

    moto keeps each stored message as a dozen Python objects: a run's messages table of
    60,000 rows is ~790,000 objects, and one full collection of them took 353 ms (0.0 ms
    after ``gc.freeze()``; 2,400 BatchWriteItems of 25 into moto in one process, then
    ``gc.collect(2)``), with the GIL held and every request of the server waiting. In the
    ingestion benchmark's 1000 x 0.5/s row a frame's received -> stored time jumped from
    ~80 ms to 500-800 ms every 20-35 s, each time the table had grown by a quarter (what
    triggers a full collection). Stored rows are not cyclic garbage; what this gives up
    is only collecting cycles among objects that were alive at a freeze and die later (a
    request in flight at that instant): a small, bounded leak for a test server."""
    import gc

    while not stop.wait(every_s):
        gc.freeze()


class Emulator:
    """moto server on a free loopback port, in a background thread of this process.
    ``freeze_gc``: run :func:`freeze_survivors` beside it (the standalone server does;
    an emulator embedded in a test process leaves that process's collector alone).
    ``partition_writes_per_s``: each partition's write limit (:mod:`.emulator_partitions`);
    ``partition_clock``: what refills its buckets (a test's own clock, to be exact)."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, freeze_gc: bool = False, partition_writes_per_s: float = 0,
        partition_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from moto.moto_server.werkzeug_app import MotoRequestHandler

        class QuietHandler(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                """One line per request would drown the fleet's own logs."""

        app = build_app(partition_writes_per_s=partition_writes_per_s, partition_clock=partition_clock)
        self._server = make_server(host, port, app, threaded=True, request_handler=QuietHandler)
        # Stops within 50 ms (the local API's interval too): tests start and stop many.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="moto-server", daemon=True
        )
        self._stop = threading.Event()
        self._freezer = (
            threading.Thread(target=freeze_survivors, args=(self._stop,), name="gc-freezer", daemon=True)
            if freeze_gc else None
        )

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "Emulator":
        self._thread.start()
        if self._freezer is not None:
            self._freezer.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._thread.join(timeout=10)
        self._server.server_close()

    def __enter__(self) -> "Emulator":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def create_queue(sqs: Any, queue_name: str) -> str:
    """The START queue with the stack's redrive policy: a hint received
    :data:`schema.MAX_HINT_RECEIVES` times without a delete moves to the dead-letter queue
    (moto applies the policy at the next receive, as SQS does), so that a hint bounced
    between workers shows locally as it would in AWS. Returns the queue's URL."""
    dead = sqs.create_queue(QueueName=queue_name + DEAD_LETTER_SUFFIX)["QueueUrl"]
    dead_arn = sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = json.dumps({"deadLetterTargetArn": dead_arn, "maxReceiveCount": str(schema.MAX_HINT_RECEIVES)})
    return sqs.create_queue(QueueName=queue_name, Attributes={"VisibilityTimeout": "30", "RedrivePolicy": redrive})["QueueUrl"]


def dead_letters(sqs: Any, queue_url: str) -> int:
    """How many hints the START queue at ``queue_url`` has moved to its dead-letter queue
    (the depth the stack's alarm watches: visible, plus any in flight)."""
    policy = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["RedrivePolicy"])["Attributes"]["RedrivePolicy"]
    dead = sqs.get_queue_url(QueueName=json.loads(policy)["deadLetterTargetArn"].rsplit(":", 1)[1])["QueueUrl"]
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=names)["Attributes"]
    return sum(int(attributes.get(n, 0)) for n in names)


def create_resources(
    endpoint_url: str,
    *,
    region: str = DEFAULT_REGION,
    table_name: str = TABLE_NAME,
    sessions_table_name: str = SESSIONS_TABLE_NAME,
    messages_table_name: str = MESSAGES_TABLE_NAME,
    messages_bucket_name: str = MESSAGES_BUCKET_NAME,
    queue_name: str = QUEUE_NAME,
    sink: str = schema.SINK_DYNAMODB,
    messages_stream_name: str = MESSAGES_STREAM_NAME,
    stream_shards: int = STREAM_SHARDS,
    delivery_stream_name: str = MESSAGES_DELIVERY_STREAM_NAME,
    delivery_bucket_name: str = DELIVERY_BUCKET_NAME,
    client: Callable[[str], Any] | None = None,
) -> dict[str, str]:
    """Create the tables (from :mod:`wsfleet.schema`), the bucket and the queue, and the
    messages stream when ``sink`` (a ``SINK`` value) has kinesis, the delivery stream
    and its bucket when it has firehose (the harness finds the bucket from the stream's
    description: :func:`sim.delivery_audit.read_delivery`); return the environment
    variables the worker and the router need to reach them, ``SINK`` among them (Secrets
    Manager answers on the same endpoint: secrets under :data:`secrets.SECRET_PREFIX` are
    allowed in ``secret_headers``, see :func:`secrets.put_secret`). ``client(service)``:
    a client of ``endpoint_url`` to create them with (default: a new session's; the
    tests, which create resources hundreds of times, pass clients made once)."""
    sinks = config.sinks({settings_spec.SINK: sink})
    if client is None:
        session = emulator_session(region)
        client = functools.partial(session.client, endpoint_url=endpoint_url)
    ddb = client("dynamodb")
    ddb.create_table(**schema.connections_table_spec(table_name))
    ddb.create_table(**schema.sessions_table_spec(sessions_table_name))
    ddb.update_time_to_live(
        TableName=sessions_table_name, TimeToLiveSpecification={"Enabled": True, "AttributeName": schema.SESSION_TTL}
    )
    ddb.create_table(**schema.messages_table_spec(messages_table_name))
    sqs = client("sqs")
    queue_url = create_queue(sqs, queue_name)
    s3 = client("s3")
    _create_bucket(s3, messages_bucket_name, region)
    stream: dict[str, str] = {}
    if schema.SINK_KINESIS in sinks:
        kinesis = client("kinesis")
        kinesis.create_stream(StreamName=messages_stream_name, ShardCount=stream_shards)
        kinesis.get_waiter("stream_exists").wait(StreamName=messages_stream_name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 300})
        stream = {settings_spec.MESSAGES_STREAM_NAME: messages_stream_name}
    if schema.SINK_FIREHOSE in sinks:
        _create_bucket(s3, delivery_bucket_name, region)
        client("firehose").create_delivery_stream(
            DeliveryStreamName=delivery_stream_name,
            DeliveryStreamType="DirectPut",
            ExtendedS3DestinationConfiguration={
                "RoleARN": "arn:aws:iam::123456789012:role/wsfleet-delivery",  # moto assumes nothing
                "BucketARN": f"arn:aws:s3:::{delivery_bucket_name}",
                "Prefix": DELIVERY_PREFIX,
            },
        )
        stream |= {settings_spec.MESSAGES_DELIVERY_STREAM_NAME: delivery_stream_name}
    return {
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_REGION": region,
        **CREDENTIALS,
        "TABLE_NAME": table_name,
        "SESSIONS_TABLE_NAME": sessions_table_name,
        "MESSAGES_TABLE_NAME": messages_table_name,
        "MESSAGES_BUCKET_NAME": messages_bucket_name,
        "QUEUE_URL": queue_url,
        "UPSTREAM_SECRET_PREFIX": SECRET_PREFIX,
        settings_spec.SINK: ",".join(sinks),
        **stream,
    }


def _create_bucket(s3: Any, name: str, region: str) -> None:
    if region == "us-east-1":
        s3.create_bucket(Bucket=name)
    else:
        s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": region})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--create", action="store_true", help="create the tables and queue, print their env as JSON")
    parser.add_argument("--partition-writes-per-s", type=float, default=0, metavar="N",
                        help="items a second each partition of a BatchWriteItem takes (0: no limit)")
    args = parser.parse_args(argv)
    if args.partition_writes_per_s < 0:
        parser.error(f"--partition-writes-per-s must be 0 or more, got {args.partition_writes_per_s:g}")
    route_stdlib_logging(component="emulator")
    emulator = Emulator(args.host, args.port, freeze_gc=True, partition_writes_per_s=args.partition_writes_per_s).start()
    print(f"READY {emulator.endpoint_url}", flush=True)
    if args.create:
        print(json.dumps(create_resources(emulator.endpoint_url)), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
