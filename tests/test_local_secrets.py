"""Secrets Manager on the emulator's endpoint: the embedded default's secret prefix, the
put/rotate helper, and the emulator's layers (DynamoDB lock, faults, ledger) letting it
through - but for an outage of its own, which the worker must survive."""

from __future__ import annotations

import subprocess
import sys

import pytest
from botocore.exceptions import ClientError

from wsfleet import upstream_spec
from sim.emulator import request_ledger, set_faults
from wsfleet.validation import Invalid
from sim.secrets import SECRET_PREFIX, put_secret, secret_name

from tests.conftest import own_emulator


@pytest.fixture
def own():
    yield from own_emulator("secretsmanager")


def test_the_embedded_default_allows_secrets_under_its_prefix(own):
    url, env, client = own
    assert env["UPSTREAM_SECRET_PREFIX"] == SECRET_PREFIX == "wsfleet/local/"
    arn = put_secret(url, "demo/key", "v1")
    ref = upstream_spec.parse_secret_ref(arn, env["UPSTREAM_SECRET_PREFIX"])
    assert ref.arn == arn and ":secret:wsfleet/local/demo/key" in arn
    assert client.get_secret_value(SecretId=arn)["SecretString"] == "v1"
    with pytest.raises(Invalid) as refused:  # a secret outside the prefix is not allowed
        upstream_spec.parse_secret_ref(arn.replace("wsfleet/local/", "other/"), env["UPSTREAM_SECRET_PREFIX"])
    assert refused.value.code == upstream_spec.SECRET_NOT_ALLOWED


def test_putting_an_existing_secret_rotates_it_under_the_same_arn(own):
    url, _, client = own
    first = put_secret(url, "wsfleet/local/rot", {"token": "old"})
    second = put_secret(url, "rot", {"token": "new"})
    assert first == second and secret_name("rot") == "wsfleet/local/rot"
    assert client.get_secret_value(SecretId=first)["SecretString"] == '{"token": "new"}'
    assert len(client.list_secret_version_ids(SecretId=first)["Versions"]) == 2


def test_dynamodb_faults_and_the_ledger_leave_secrets_manager_alone(own):
    url, env, client = own
    arn = put_secret(url, "k", "v")
    set_faults(url, throttle=1.0, ambiguous=1.0, latency_ms=1)
    assert client.get_secret_value(SecretId=arn)["SecretString"] == "v"
    assert all(row["op"] != "GetSecretValue" for row in request_ledger(url))


def test_a_secrets_manager_outage_fails_its_requests_with_its_own_error(own):
    url, _, client = own
    arn = put_secret(url, "k", "v")
    set_faults(url, outage={"secretsmanager": 60})
    with pytest.raises(ClientError) as caught:
        client.get_secret_value(SecretId=arn)
    assert caught.value.response["Error"]["Code"] == "InternalServiceError"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    set_faults(url)
    assert client.get_secret_value(SecretId=arn)["SecretString"] == "v"


@pytest.mark.slow
def test_the_process_prints_the_arn_and_never_the_value(own, python_env):
    url, _, client = own
    done = subprocess.run(
        [sys.executable, "-m", "sim.secrets", "--endpoint-url", url, "cli/key", "hidden-value"],
        env=python_env, capture_output=True, text=True, timeout=60, check=True,
    )
    arn = done.stdout.strip()
    assert arn.startswith("arn:aws:secretsmanager:") and "hidden-value" not in done.stdout + done.stderr
    assert client.get_secret_value(SecretId=arn)["SecretString"] == "hidden-value"
