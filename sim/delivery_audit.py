"""The delivery stream's S3 objects read back whole, and audited as the messages stream
is (:mod:`.stream_audit`): what ``SINK=firehose`` runs (the demo, the fleet test) are
judged by.

Reading (:func:`read_delivery`) is the harness's: the bucket and prefix from the
delivery stream's own description, then every object under the prefix, every JSON line
of it a :class:`~.stream_audit.Delivery` (a line that does not decode, or whose
``connection_bucket`` is not its connection's, is kept as a finding).

S3 holds no order: a reader sorts by seq. So the lines are put in the order such a
reader keeps them, per connection by fence, then seq (then where they were read), and
:func:`.stream_audit.audit` runs over that order unchanged: ``gap`` (every seq up to
the final checkpoint, none missing), ``duplicate`` and ``bound`` (a seq again only with
a higher fence, above the checkpoint that fence was acquired with, within the window;
or with the same fence, a resend), ``data`` (what the upstream sent), and ``order``
(in seq order, each seq's kept line has a fence no lower than a lower seq's: an older
owner's frame never follows a newer owner's). ``stale`` cannot occur in that order:
the highest fence is the one kept, and a lower fence's line of a seq the higher one
carries too is counted as delivered again, not lost.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterator

from wsfleet import records
from wsfleet.records import BadRecord
from wsfleet.records import CONNECTION_BUCKET, connection_bucket

from .stream_audit import Delivery

SHARD = "firehose"  # every line's shard_id: one place, no order of its own


def delivery_objects(firehose: Any, s3: Any, delivery_stream: str,
                     cache: dict[str, bytes] | None = None) -> Iterator[tuple[str, bytes]]:
    """(key, body) of every object the delivery stream has put in S3 now, by key: the
    bucket and prefix from the stream's own description. ``firehose``, ``s3``: harness
    clients; ``cache``: bodies already read, by key (an object is written once: a
    reader that reads again lists, and gets only the new ones)."""
    cache = {} if cache is None else cache
    destination = firehose.describe_delivery_stream(DeliveryStreamName=delivery_stream)["DeliveryStreamDescription"][
        "Destinations"
    ][0]
    s3_dest = destination.get("ExtendedS3DestinationDescription") or destination["S3DestinationDescription"]
    bucket, prefix = s3_dest["BucketARN"].split(":::", 1)[1], s3_dest.get("Prefix", "")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in sorted(page.get("Contents", []), key=lambda o: o["Key"]):
            if obj["Key"] not in cache:
                cache[obj["Key"]] = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            yield obj["Key"], cache[obj["Key"]]


def read_delivery(firehose: Any, s3: Any, delivery_stream: str, cache: dict[str, bytes] | None = None) -> list[Delivery]:
    """Every line the delivery stream has put in S3 now, in a reader's order (the
    module's docstring)."""
    read: list[Delivery] = []
    for key, body in delivery_objects(firehose, s3, delivery_stream, cache):
        for n, line in enumerate(body.splitlines(), 1):
            if line.strip():
                read.append(_delivery(len(read), f"{key}:{n}", line))
    ordered = sorted(read, key=lambda d: (d.record.connection_id, d.record.fence_token, d.record.seq, d.position)
                     if d.record is not None else ("", 0, 0, d.position))
    return [dataclasses.replace(d, position=i) for i, d in enumerate(ordered)]


def _delivery(position: int, where: str, line: bytes) -> Delivery:
    try:
        record = records.decode(line)
    except BadRecord as exc:
        return Delivery(position, SHARD, where, "", None, str(exc))
    bucket = json.loads(line).get(CONNECTION_BUCKET)
    if bucket != connection_bucket(record.connection_id):
        return Delivery(position, SHARD, where, record.connection_id, None,
                        f"{CONNECTION_BUCKET} {bucket!r}, not {connection_bucket(record.connection_id)} of {record.connection_id!r}")
    return Delivery(position, SHARD, where, record.connection_id, record)

