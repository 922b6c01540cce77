"""Upgrading a stack deployed before issue 22 (docs/operations.md, "Upgrading an existing stack"):
its sessions table has the ring index ``by_ring`` (KEYS_ONLY), the code now queries
``by_ring_load`` (INCLUDE the load). CloudFormation cannot change an index's projection
in place, and a table update creates or deletes one index, so the upgrade takes two
deploys: ``-c keep_legacy_ring_index=on`` (both indexes, the workers may query both),
then without it (the old one dropped)."""

from __future__ import annotations

import json

import pytest

from stacks.constructs.tables import LEGACY_RING_INDEX, SESSIONS_LOGICAL_ID, legacy_ring_index_spec
from stacks.settings import EnvironmentSettings
from stacks.settings_parts import SettingsError
from stacks.synth import with_context
from tests.stacks.conftest import synthesize
from tests.stacks.policies import actions, statements
from wsfleet import schema

# The sessions table's indexes as the stacks before issue 22 deployed them (their
# snapshot at 30c7ec2), written out here: the code no longer builds them.
BEFORE = [
    {
        "IndexName": "by_ring",
        "KeySchema": [
            {"AttributeName": "ring", "KeyType": "HASH"},
            {"AttributeName": "session_id", "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "KEYS_ONLY"},
    }
]


@pytest.fixture(scope="module")
def upgrading(tmp_path_factory):
    """dev as the first deploy of the upgrade builds it."""
    return synthesize("dev", tmp_path_factory.mktemp("cdk.out.upgrading"), keep_legacy_ring_index="on")


def _ring_indexes(env) -> dict[str, dict]:
    table = env.stateful_template.find_resources("AWS::DynamoDB::Table")[SESSIONS_LOGICAL_ID]
    return {index["IndexName"]: index for index in table["Properties"]["GlobalSecondaryIndexes"]}


def _ring_queries(env) -> set[str]:
    """The sessions indexes (of the two ring names) the workers' task role may Query."""
    arn = env.service.sessions_table.table_arn
    names = {
        json.dumps(env.service.resolve(f"{arn}/index/{index}"), sort_keys=True): index
        for index in (LEGACY_RING_INDEX, schema.RING_INDEX)
    }
    granted = set()
    for statement in statements(env, env.service.workers.task_definition.task_role):
        if "dynamodb:Query" in actions(statement):
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            granted.update(names.get(json.dumps(resource, sort_keys=True)) for resource in resources)
    return granted - {None}


def test_legacy_index_is_the_one_deployed_before():
    assert [legacy_ring_index_spec()] == BEFORE
    assert LEGACY_RING_INDEX == "by_ring" != schema.RING_INDEX


def test_each_deploy_of_the_upgrade_adds_or_drops_exactly_one_index(upgrading, dev):
    before = {index["IndexName"]: index for index in BEFORE}
    first, second = _ring_indexes(upgrading), _ring_indexes(dev)
    assert set(first) == {LEGACY_RING_INDEX, schema.RING_INDEX}
    assert set(second) == {schema.RING_INDEX}
    # deploy 1 adds by_ring_load and leaves by_ring exactly as it was (an index changed in
    # place would fail the update); deploy 2 only drops by_ring.
    assert first[LEGACY_RING_INDEX] == before[LEGACY_RING_INDEX]
    assert first[schema.RING_INDEX] == second[schema.RING_INDEX]
    for a, b in ((before, first), (first, second)):
        assert len(set(a) ^ set(b)) == 1


def test_workers_may_query_both_ring_indexes_only_while_upgrading(upgrading, dev):
    # The task role is shared by the old tasks and the new ones while the service rolls:
    # dropping the old index's grant in deploy 1 would stop the old workers' watching.
    assert _ring_queries(upgrading) == {LEGACY_RING_INDEX, schema.RING_INDEX}
    assert _ring_queries(dev) == {schema.RING_INDEX}


def test_the_service_stack_deploys_after_the_stateful_stack(upgrading):
    # `cdk deploy --all` updates the tables first, but CloudFormation does not wait for a
    # new index's backfill: docs/operations.md has the first deploy go stack by stack.
    assert [stack.stack_name for stack in upgrading.service.dependencies] == [upgrading.stateful.stack_name]


@pytest.mark.parametrize("given, kept", [("on", True), ("true", True), ("off", False), ("0", False), (True, True)])
def test_keep_legacy_ring_index_is_a_context_switch(given, kept):
    settings = EnvironmentSettings(name="dev")
    lookup = {"keep_legacy_ring_index": given}.get
    assert with_context(settings, lookup).keep_legacy_ring_index is kept


@pytest.mark.parametrize("given", ["maybe", "", "2"])
def test_a_bad_keep_legacy_ring_index_is_refused_by_name(given):
    with pytest.raises(SettingsError, match="-c keep_legacy_ring_index must be on or off"):
        with_context(EnvironmentSettings(name="dev"), {"keep_legacy_ring_index": given}.get)
