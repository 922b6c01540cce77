"""What an operator hears when a command fails: one sentence, never a traceback."""

from __future__ import annotations

from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ReadTimeoutError,
)


class CliError(Exception):
    """Something the operator has to hear about, as one sentence."""


def aws_sentence(error: Exception) -> str:
    """A boto3 or store failure as one sentence, with what to check where there is one."""
    if isinstance(error, NoCredentialsError):
        return "no AWS credentials found: configure a profile or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    if isinstance(error, NoRegionError):
        return "no AWS region: pass --region or set AWS_REGION"
    if isinstance(error, (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError)):
        # Given up within seconds (locate.CLIENT_CONFIG): say what to check, not only what failed.
        return f"{error}; check the region (--region, AWS_REGION), AWS_ENDPOINT_URL if set, and the network"
    if isinstance(error, ClientError):
        err = error.response.get("Error", {})
        sentence = f"{error.operation_name} failed: {err.get('Message') or 'no message'} ({err.get('Code', 'error')})"
        if err.get("Code") == "ResourceNotFoundException":
            sentence += "; check the table names (or --stack) and the region"
        return sentence
    return str(error)
