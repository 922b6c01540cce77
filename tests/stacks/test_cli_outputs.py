"""The stack outputs the operators' CLI finds things by (``wsfleet --stack``), under the
fixed ids of ``wsfleet.stack_outputs``: the service stack's API URL and log groups and the stateful
stack's table names, messages bucket and START queue."""

from __future__ import annotations

from aws_cdk.assertions import Match

from stacks.constructs.messages_bucket import MESSAGES_BUCKET_LOGICAL_ID
from stacks.constructs.queue import QUEUE_LOGICAL_ID
from stacks.constructs.tables import CONNECTIONS_LOGICAL_ID, MESSAGES_LOGICAL_ID, SESSIONS_LOGICAL_ID
from stacks.service_stack import API_STAGE
from wsfleet import stack_outputs


def test_the_service_stack_outputs_the_api_stage_url_as_api_url(env):
    rest_api = env.service.api.rest_api
    stage_url = env.service.resolve(rest_api.url)

    env.service_template.has_output(
        stack_outputs.API_URL, {"Value": stage_url, "Description": Match.string_like_regexp("stage URL")}
    )
    # https://<api id>.execute-api.<region>.<suffix>/<the stage>/, the stage being v1.
    parts = stage_url["Fn::Join"][1]
    stage = env.service.resolve(rest_api.deployment_stage.stage_name)
    assert ".execute-api." in parts and parts[-2:] == [stage, "/"]
    env.service_template.has_resource_properties("AWS::ApiGateway::Stage", {"StageName": API_STAGE})


def test_the_stateful_stack_outputs_each_table_name_the_bucket_and_the_queue_url_by_fixed_id(env):
    for output_id, logical_id in (
        (stack_outputs.CONNECTIONS_TABLE_NAME, CONNECTIONS_LOGICAL_ID),
        (stack_outputs.SESSIONS_TABLE_NAME, SESSIONS_LOGICAL_ID),
        (stack_outputs.MESSAGES_TABLE_NAME, MESSAGES_LOGICAL_ID),
        (stack_outputs.MESSAGES_BUCKET_NAME, MESSAGES_BUCKET_LOGICAL_ID),
        (stack_outputs.START_QUEUE_URL, QUEUE_LOGICAL_ID),
    ):
        env.stateful_template.has_output(output_id, {"Value": {"Ref": logical_id}, "Description": Match.any_value()})


def test_the_service_stack_outputs_the_workers_and_the_routers_log_groups_for_wsfleet_logs(env):
    for output_id, log_group in (
        (stack_outputs.WORKER_LOG_GROUP_NAME, env.service.workers.log_group),
        (stack_outputs.ROUTER_LOG_GROUP_NAME, env.service.router.log_group),
    ):
        env.service_template.has_output(
            output_id, {"Value": env.service.resolve(log_group.log_group_name), "Description": Match.any_value()}
        )
