"""The worker's secret cache against the emulator's Secrets Manager: one fetch per ARN
however many connections ask at once, refresh only when what is cached is not newer
than the value refused, ARN#key, and errors that name the ARN, never the value."""

from __future__ import annotations

import asyncio
import json
import uuid

import boto3
import pytest

from wsfleet import metrics_names as names
from sim.secrets import put_secret
from wsfleet.metrics import Counters
from wsfleet.upstream_spec import SecretRef
from wsfleet.worker.secrets import SecretError, Secrets


@pytest.fixture
def client(emulator):
    return boto3.client("secretsmanager", endpoint_url=emulator.endpoint_url, region_name="us-east-1")


def cache(client, **kwargs) -> tuple[Secrets, Counters]:
    counters = Counters()

    async def call(fn, /, **kw):
        return await asyncio.to_thread(fn, **kw)

    return Secrets(client=client, call=call, counters=counters, **kwargs), counters


HOST = "eu.feeds.example.com"


def resolve_for(secrets: Secrets, refs, host: str = HOST):
    return secrets.resolve(refs, host=host)


def new_secret(emulator, value) -> tuple[str, str]:
    name = f"test/{uuid.uuid4().hex[:8]}"
    return name, put_secret(emulator.endpoint_url, name, value)


def test_connections_asking_at_once_share_one_fetch_and_a_json_field_is_taken(emulator, client):
    _, arn = new_secret(emulator, {"key": "k-1", "other": "o-1"})
    secrets, counters = cache(client)

    async def scenario():
        asks = [resolve_for(secrets, [("X-Key", SecretRef(arn, "key")), ("X-Other", SecretRef(arn, "other"))]) for _ in range(20)]
        return await asyncio.gather(*asks)

    got = asyncio.run(scenario())
    assert {r.headers for r in got} == {(("X-Key", "k-1"), ("X-Other", "o-1"))}
    assert counters.total(names.SECRET_FETCHES) == 1


def test_refusals_after_one_rotation_cost_one_fetch(emulator, client):
    name, arn = new_secret(emulator, "v1")
    secrets, counters = cache(client)
    ref = [("Authorization", SecretRef(arn))]

    async def scenario():
        used = await resolve_for(secrets, ref)
        put_secret(emulator.endpoint_url, name, "v2")
        assert (await resolve_for(secrets, ref)).headers == (("Authorization", "v1"),)  # cached until refused
        # A hundred connections refused with v1 ask for values newer than the ones they used.
        await asyncio.gather(*(secrets.refresh([arn], since=used.fetched_at) for _ in range(100)))
        fresh = await resolve_for(secrets, ref)
        await secrets.refresh([arn], since=used.fetched_at)  # a late refusal of v1: v2 is newer already
        return fresh

    fresh = asyncio.run(scenario())
    assert fresh.headers == (("Authorization", "v2"),)
    assert counters.total(names.SECRET_FETCHES) == 2


def test_a_value_past_its_time_is_fetched_again(emulator, client):
    _, arn = new_secret(emulator, "v")
    secrets, counters = cache(client, ttl_s=0.0)

    async def scenario():
        for _ in range(3):
            await resolve_for(secrets, [("A", SecretRef(arn))])

    asyncio.run(scenario())
    assert counters.total(names.SECRET_FETCHES) == 3


@pytest.mark.parametrize(
    ("value", "key", "says"),
    [
        ("plain-secret-value", "key", "not JSON"),
        ({"other": "secret-value-1"}, "key", "has no field 'key'"),
        ({"key": 31415926}, "key", "is not a string"),
        ("line\r\nInjected: secret-value-2", None, "not a valid header value"),
    ],
)
def test_a_secret_that_cannot_be_a_header_is_an_error_naming_the_arn_and_key_not_the_value(
    emulator, client, value, key, says
):
    _, arn = new_secret(emulator, value)
    secrets, _ = cache(client)
    with pytest.raises(SecretError) as caught:
        asyncio.run(resolve_for(secrets, [("A", SecretRef(arn, key))]))
    message = str(caught.value)
    assert arn in message and says in message
    text = value if isinstance(value, str) else json.dumps(value)
    assert "secret-value" not in message and text not in message and "31415926" not in message


def test_a_missing_secret_is_an_error_naming_the_arn(emulator, client):
    _, arn = new_secret(emulator, "v")
    missing = arn.replace("test/", "test/missing-")
    secrets, counters = cache(client)
    with pytest.raises(SecretError, match="ResourceNotFound"):
        asyncio.run(resolve_for(secrets, [("A", SecretRef(missing))]))
    assert counters.total(names.SECRET_FETCHES) == 1


def test_a_caller_cancelled_while_waiting_does_not_cancel_the_fetch_the_others_share(emulator, client):
    _, arn = new_secret(emulator, "shared")
    secrets, counters = cache(client)
    ref = [("A", SecretRef(arn))]

    async def scenario():
        leaving = asyncio.ensure_future(resolve_for(secrets, ref))
        staying = asyncio.ensure_future(resolve_for(secrets, ref))
        await asyncio.sleep(0)  # both wait on the one fetch
        leaving.cancel()  # its connection stopped meanwhile
        return await staying, leaving

    got, leaving = asyncio.run(scenario())
    assert got.headers == (("A", "shared"),) and leaving.cancelled()
    assert counters.total(names.SECRET_FETCHES) == 1


def test_after_a_refusal_every_secret_the_handshake_used_is_fetched_again(emulator, client):
    a_name, a = new_secret(emulator, "a1")
    b_name, b = new_secret(emulator, "b1")
    secrets, counters = cache(client)
    refs = [("A", SecretRef(a)), ("B", SecretRef(b))]

    async def scenario():
        used = await resolve_for(secrets, refs)
        put_secret(emulator.endpoint_url, a_name, "a2")
        put_secret(emulator.endpoint_url, b_name, "b2")
        await secrets.refresh([a, b], since=used.fetched_at)
        return await resolve_for(secrets, refs)

    assert asyncio.run(scenario()).headers == (("A", "a2"), ("B", "b2"))
    assert counters.total(names.SECRET_FETCHES) == 4
