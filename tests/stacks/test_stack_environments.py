"""The environments the service stack gives the worker, the router and the reference
consumer hold every variable the declaration (wsfleet.settings_spec) says the stacks must
set for that reader, and no variable that reader does not read."""

from __future__ import annotations

import pytest

from stacks.constructs.consumer import HANDLER as CONSUMER_HANDLER
from wsfleet import settings_spec


def _function_environment(synthesized, handler: str) -> dict:
    (function,) = synthesized.service_template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": handler}}
    ).values()
    return function["Properties"]["Environment"]["Variables"]


def _worker_environment(synthesized) -> dict:
    (task,) = synthesized.service_template.find_resources("AWS::ECS::TaskDefinition").values()
    (worker,) = [c for c in task["Properties"]["ContainerDefinitions"] if c["Name"] == "worker"]
    return {e["Name"]: e["Value"] for e in worker["Environment"]}


def _environments(synthesized) -> dict[str, dict]:
    found = {
        settings_spec.WORKER: _worker_environment(synthesized),
        settings_spec.ROUTER: _function_environment(synthesized, "wsfleet.router.handler"),
    }
    if synthesized.settings.consumer is not None:
        found[settings_spec.CONSUMER] = _function_environment(synthesized, CONSUMER_HANDLER)
    return found


@pytest.fixture(params=["dev", "prod", "kinesis_only", "tracing_off", "otel_sdk"])
def app_env(request, synthesized):
    """Each environment as app.py has it, and the variants the other stack tests build."""
    if request.param in synthesized:
        return synthesized[request.param]
    return request.getfixturevalue(request.param)


def test_every_variable_the_stacks_must_set_is_set_for_each_reader(app_env):
    environments = _environments(app_env)
    assert set(environments) >= {settings_spec.WORKER, settings_spec.ROUTER}
    for reader, variables in environments.items():
        missing = settings_spec.set_by_stacks(reader) - set(variables)
        assert not missing, f"the {reader}'s environment lacks {sorted(missing)}"


def test_no_environment_names_a_variable_its_reader_does_not_read(app_env):
    for reader, variables in _environments(app_env).items():
        declared = {v.name for v in settings_spec.read_by(reader)}
        assert set(variables) <= declared, f"the {reader} reads no {sorted(set(variables) - declared)}"


def test_the_sink_variables_are_set_where_the_settings_have_them(app_env):
    for reader in (settings_spec.WORKER, settings_spec.ROUTER):
        variables = _environments(app_env)[reader]
        assert (settings_spec.MESSAGES_TABLE_NAME in variables) == app_env.settings.stores_in_table
        assert (settings_spec.SINK in variables) == app_env.settings.has_stream
        assert (settings_spec.MESSAGES_STREAM_NAME in variables) == app_env.settings.has_stream
