"""The messages bucket: data too large for a messages-table item, one object per
(connection, seq) under ``wsfleet.schema.MESSAGE_OBJECTS_PREFIX`` (CONTRACT section 4).

It lives and dies with the messages table: kept in prod, destroyed with the stack in dev,
and its objects expire with the items that point at them (``message_ttl_days``).
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_s3 as s3
from constructs import Construct

# Fixed like the tables' ids, so that moving the construct never replaces (and empties) it.
MESSAGES_BUCKET_LOGICAL_ID = "MessagesBucket"
# A worker that dies mid-upload leaves parts nobody completes; a day is long past any
# upload of a frame (at most MAX_FRAME_BYTES).
ABORT_INCOMPLETE_UPLOADS_AFTER = Duration.days(1)


class MessagesBucket(Construct):
    def __init__(self, scope: Construct, id: str, *, retain_data: bool, message_ttl_days: int) -> None:
        """``message_ttl_days`` is the workers' MESSAGE_TTL_DAYS: 0 keeps objects as long
        as items (for ever)."""
        super().__init__(scope, id)
        rule = s3.LifecycleRule(
            id="messages",
            abort_incomplete_multipart_upload_after=ABORT_INCOMPLETE_UPLOADS_AFTER,
            # S3 counts the days from the object's creation and rounds up to the next
            # midnight UTC; the object is written just before its item, whose expires_at
            # is that item's write time plus the same days: an object never expires
            # before the item that points at it.
            expiration=Duration.days(message_ttl_days) if message_ttl_days else None,
        )
        self.bucket = private_bucket(self, "Bucket", rule=rule, retain_data=retain_data, logical_id=MESSAGES_BUCKET_LOGICAL_ID)


def private_bucket(scope: Construct, id: str, *, rule: s3.LifecycleRule, retain_data: bool, logical_id: str) -> s3.Bucket:
    """A bucket of ours (the messages bucket, the reference consumer's output): private,
    TLS only, SSE-S3, no versions, kept with the data or destroyed with the stack."""
    bucket = s3.Bucket(
        scope,
        id,
        # SSE-S3: the roles that touch objects need no key grants, and a presigned GET
        # works for the router's role alone. SSE-KMS would add a KMS call per object
        # (priced per request) and kms:GenerateDataKey / kms:Decrypt grants, for an
        # access control the bucket's IAM grants already give.
        encryption=s3.BucketEncryption.S3_MANAGED,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
        enforce_ssl=True,
        minimum_tls_version=1.2,
        # No versioning: a replay after a takeover (or a retried consumer batch) rewrites
        # the same key with the same data, so old versions would only double the storage
        # and outlive the lifecycle expiry.
        versioned=False,
        lifecycle_rules=[rule],
        removal_policy=RemovalPolicy.RETAIN if retain_data else RemovalPolicy.DESTROY,
        # Like the tables in dev: deleting the stack deletes the data. A bucket must be
        # empty to be deleted, so CDK's custom resource empties it first.
        auto_delete_objects=not retain_data,
    )
    bucket.node.default_child.override_logical_id(logical_id)
    return bucket
