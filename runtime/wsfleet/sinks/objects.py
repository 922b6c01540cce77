"""The messages bucket: data too large for an item, one S3 object per (connection, seq).

The claim-check pattern (as the SQS and SNS extended clients do it): the object holds
the data's compact JSON, UTF-8, exactly what ``message_data`` would have held, at
:func:`wsfleet.schema.message_object_key`; the message item points at it with
``data_ref``, ``data_bytes`` and ``data_sha256`` (CONTRACT.md section 4). The object is
stored before its item, so an item never points at nothing. A replay after a takeover
rewrites the same key with the same data, never a second object.

The same error rules as the tables: a transient fault (throttling, SlowDown, a timeout,
5xx) is raised as :class:`TransientError`, the send deadline's own refusal unwrapped;
anything else (AccessDenied, NoSuchBucket) is raised as it is, for the caller's
supervisor to retry with backoff.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any, Mapping

from botocore.exceptions import BotoCoreError, ClientError

from .. import schema
from ..stream import MAX_MESSAGE_BYTES, Frame
from ..store.base import TransientError, is_transient, unwrap_refusal

CONTENT_TYPE = "application/json"
# Data is encoded for its upload a piece of this many characters at a time (in a pool
# thread): encoding 32 MiB at once would hold the GIL, so the event loop, 50-140 ms.
ENCODE_PIECE_CHARS = 1 << 20


class CorruptObject(Exception):
    """A stored object is not the data its item describes (size or SHA-256 differ)."""


@dataclass(frozen=True)
class StoredObject:
    """Where a frame's data was stored, and what its item says about it."""

    ref: str  # s3://bucket/key
    size: int  # bytes
    sha256: str  # hex


def data_size(frame: Frame) -> int:
    """The UTF-8 size of a frame's data as compact JSON (0 for a marker)."""
    if frame.data_json is None:
        return 0
    return frame.data_bytes if frame.data_bytes is not None else len(frame.data_json.encode("utf-8"))


def needs_object(frame: Frame) -> bool:
    """Whether the frame's data is too large for an item: stored as an object instead."""
    return frame.data_json is not None and data_size(frame) > MAX_MESSAGE_BYTES


def _utf8(text: str) -> bytes:
    """``text`` as UTF-8, encoded a piece at a time (the join at the end is one copy)."""
    if len(text) <= ENCODE_PIECE_CHARS:
        return text.encode("utf-8")
    return b"".join([text[i : i + ENCODE_PIECE_CHARS].encode("utf-8") for i in range(0, len(text), ENCODE_PIECE_CHARS)])


class ObjectsStore:
    """The messages bucket. Calls are synchronous boto3, like the tables' (the worker runs
    them in its pool, under the send deadline)."""

    def __init__(self, client: Any, bucket_name: str) -> None:
        self._s3 = client
        self.bucket = bucket_name

    def put(self, connection_id: str, seq: int, data_json: str) -> StoredObject:
        """Store one frame's data at its key, replacing whatever a replay stored there
        before (the same data). S3 checks the body against the SHA-256 sent with it, so a
        body damaged on the way is refused, never stored."""
        body = _utf8(data_json)
        digest = hashlib.sha256(body).digest()  # (hashlib lets go of the GIL for data this large)
        key = schema.message_object_key(connection_id, seq)
        self._call(
            "put_object",
            Bucket=self.bucket,
            Key=key,
            Body=body,
            ContentType=CONTENT_TYPE,
            ChecksumSHA256=base64.b64encode(digest).decode("ascii"),
        )
        return StoredObject(schema.data_ref(self.bucket, key), len(body), digest.hex())

    def get(self, ref: str) -> bytes:
        """The object a ``data_ref`` names, whole."""
        bucket, key = schema.parse_data_ref(ref)
        return self._call("get_object", Bucket=bucket, Key=key)["Body"].read()

    def data_of(self, item: Mapping[str, Any]) -> str | None:
        """A message item's data as compact JSON: inline, or read from its object and
        checked against the item's size and SHA-256 (:class:`CorruptObject` if they
        differ); None for a skip marker."""
        if schema.MESSAGE_DATA in item:
            return item[schema.MESSAGE_DATA]
        if schema.DATA_REF not in item:
            return None
        body = self.get(item[schema.DATA_REF])
        if len(body) != item.get(schema.DATA_BYTES) or hashlib.sha256(body).hexdigest() != item.get(schema.DATA_SHA256):
            raise CorruptObject(f"{item[schema.DATA_REF]} is not the data its item describes")
        return body.decode("utf-8")

    def _call(self, op: str, **kwargs: Any) -> Any:
        try:
            return getattr(self._s3, op)(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            if refused := unwrap_refusal(exc):
                raise refused from None  # past its deadline: a retry would be refused too
            if is_transient(exc):
                raise TransientError(f"{op}: {exc}") from exc
            raise
