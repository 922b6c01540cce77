"""How a client reaches the emulator: its default region, the credentials moto accepts,
and a boto3 session signing with them. Below both :mod:`.emulator` and :mod:`.secrets`,
which each need it."""

from __future__ import annotations

from typing import Any

DEFAULT_REGION = "us-east-1"
# moto accepts any credentials; these make boto3 sign requests without a profile.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def emulator_session(region: str = DEFAULT_REGION) -> Any:
    """A boto3 session that signs with :data:`CREDENTIALS`, whatever this process's own
    environment holds: for clients of the emulator, and for URLs presigned for it."""
    import boto3

    return boto3.session.Session(
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=region,
    )
