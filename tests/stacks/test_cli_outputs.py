"""The stack outputs the operators' CLI finds things by (``wsfleet --stack``): the
service stack's API endpoint and the stateful stack's table names."""

from __future__ import annotations

import json

from wsfleet import cli


def _outputs(template) -> dict:
    return template.to_json().get("Outputs", {})


def test_the_service_stack_has_the_one_api_endpoint_output_the_cli_reads(env):
    endpoints = [output for key, output in _outputs(env.service_template).items() if cli.API_OUTPUT.fullmatch(key)]

    [endpoint] = endpoints
    assert ".execute-api." in json.dumps(endpoint["Value"])


def test_the_stateful_stack_outputs_each_table_name_the_cli_reads(env):
    names = {}
    for key, output in _outputs(env.stateful_template).items():
        match = cli.TABLE_OUTPUT.fullmatch(key)
        if match:
            names[match.group(1)] = output["Value"]

    assert names == {table: {"Ref": table} for table in ("ConnectionsTable", "SessionsTable", "MessagesTable")}
