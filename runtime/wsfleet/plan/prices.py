"""The list prices the plan prices the messages with, in one place: us-east-1 (the one
Region the plan carries, :data:`.model.PRICES_REGION`), read from each service's pricing
page in December 2026. Check them before relying on them. DynamoDB's on-demand request
prices come with the measured counts instead (``measured_ops.json``'s ``prices``), as
the rest of the plan reads them.

Pure data: every other module of :mod:`wsfleet.plan` may import it; it imports nothing.
"""

from __future__ import annotations

# Kinesis Data Streams, On-demand Standard (aws.amazon.com/kinesis/data-streams/pricing):
# the stream's hourly charge, data in and data out per GB (each record rounded up to the
# next KB, 1,024 bytes, for both), extended retention (24 h - 7 days) and long-term
# retention (beyond 7 days) per GB-month. AWS's "On-demand Advantage" account mode drops
# the per-stream charge and prices data at least 60 % lower: these figures are the
# Standard mode's, so an upper bound.
KINESIS_PRICES = {
    "stream_hour": 0.04,
    "ingest_gb": 0.08,
    "retrieval_gb": 0.04,
    "extended_retention_gb_month": 0.10,
    "long_term_retention_gb_month": 0.023,
}
# Kinesis Data Streams, provisioned (the same page): each shard by the hour, and each
# record's PUT payload units (25 KB each, a record rounded up to whole units); reading
# through the shards' shared 2 MB/s costs nothing more. Extended retention (up to 7 days)
# by the shard-hour, long-term retention (beyond 7 days) per GB-month.
KINESIS_PROVISIONED_PRICES = {
    "shard_hour": 0.015,
    "put_payload_units_per_million": 0.014,
    "extended_retention_shard_hour": 0.02,
    "long_term_retention_gb_month": 0.023,
}
PUT_PAYLOAD_UNIT_BYTES = 25 * 1024

KMS_PRICES = {"key_month": 1.0, "per_10k_requests": 0.03}  # the monthly free tier of 20,000 requests is not counted
LAMBDA_PRICES = {"per_million_requests": 0.20, "gb_second": 0.0000166667}  # x86

# DynamoDB Standard table class (aws.amazon.com/dynamodb/pricing): storage per GB-month,
# and provisioned capacity by the unit-hour (on-demand requests: measured_ops.json).
DYNAMODB_STORAGE_GB_MONTH = 0.25
DYNAMODB_PROVISIONED_PRICES = {"wcu_hour": 0.00065, "rcu_hour": 0.00013}

# S3 Standard (aws.amazon.com/s3/pricing).
S3_PRICES = {"put_per_thousand": 0.005, "get_per_thousand": 0.0004, "gb_month": 0.023}

# Amazon Data Firehose, Direct PUT (aws.amazon.com/firehose/pricing): ingestion per GB in
# tiers by the month's volume, each record rounded up to the next 5 KB (5,120 bytes);
# dynamic partitioning per GB processed and per 1,000 S3 objects delivered (its JQ
# processing hours, where partition keys are parsed with JQ, are not counted here).
FIREHOSE_INGEST_TIERS_GB = ((500 * 1024, 0.029), (1536 * 1024, 0.025), (3072 * 1024, 0.020))
FIREHOSE_PRICES = {"dynamic_partitioning_gb": 0.020, "per_1000_objects": 0.005}
FIREHOSE_RECORD_ROUNDING_BYTES = 5 * 1024
