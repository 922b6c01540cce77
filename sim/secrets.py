"""Upstream credentials in the emulator's Secrets Manager, for the demo, the tests and
a person trying ``secret_headers`` locally.

The embedded default allows secrets under :data:`SECRET_PREFIX` (its
``UPSTREAM_SECRET_PREFIX``). :func:`put_secret` creates one or, when it exists, makes a
new current version of it (a rotation: the ARN stays, the worker's next fetch gets the
new value). As a process it prints the ARN, for a START's ``secret_headers``::

    python -m sim.secrets --endpoint-url http://127.0.0.1:PORT demo/api-key VALUE
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from wsfleet.credentials import SECRET_HOSTS_TAG

from .emulator_client import DEFAULT_REGION, emulator_session

SECRET_PREFIX = "wsfleet/local/"


def secret_name(name: str) -> str:
    """``name`` under :data:`SECRET_PREFIX` (given with or without it)."""
    return name if name.startswith(SECRET_PREFIX) else SECRET_PREFIX + name


def put_secret(
    endpoint_url: str, name: str, value: str | dict[str, Any], *, region: str | None = None, hosts: str | None = None
) -> str:
    """Create the secret ``name`` (under :data:`SECRET_PREFIX`) with ``value`` (a dict is
    stored as JSON, for ``ARN#key`` references), or put ``value`` as its new current
    version if it exists; returns its ARN. The value is never logged. ``hosts``: its
    ``wsfleet:hosts`` tag (space-separated host names, ``.domain`` for a domain and its
    subdomains), the hosts it may be sent to."""
    from botocore.exceptions import ClientError

    client = emulator_session(region or DEFAULT_REGION).client("secretsmanager", endpoint_url=endpoint_url)
    text = value if isinstance(value, str) else json.dumps(value)
    full = secret_name(name)
    tags = [{"Key": SECRET_HOSTS_TAG, "Value": hosts}] if hosts is not None else []
    try:
        return client.create_secret(Name=full, SecretString=text, Tags=tags)["ARN"]
    except ClientError as error:
        if error.response["Error"]["Code"] != "ResourceExistsException":
            raise
    if tags:
        client.tag_resource(SecretId=full, Tags=tags)
    return client.put_secret_value(SecretId=full, SecretString=text)["ARN"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.secrets", description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint-url", required=True, help="the emulator's URL (its READY line)")
    parser.add_argument("--region", default=None)
    parser.add_argument("name", help=f"the secret's name, under {SECRET_PREFIX} (added if left out)")
    parser.add_argument("value", help="its value; a JSON object is stored as it is, for ARN#key references")
    parser.add_argument("--hosts", default=None, help="its wsfleet:hosts tag: the hosts it may be sent to, space-separated")
    args = parser.parse_args(argv)
    print(put_secret(args.endpoint_url, args.name, args.value, region=args.region, hosts=args.hosts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
