"""The REST API in front of the router: ``POST /events``, ``GET`` and ``DELETE
/connections/{connection_id}`` and ``GET /connections/{connection_id}/messages``
(CONTRACT section 2), IAM (SigV4) auth on every one.

API Gateway rejects a body that cannot be an event before it costs a Lambda call; the
schema is deliberately looser than the router, so it never refuses what the CONTRACT
accepts, and everything it refuses is a 400 under the CONTRACT anyway. Its own error
responses keep the CONTRACT's ``{"error", "message"}`` shape.
"""

from __future__ import annotations

import json

from aws_cdk import RemovalPolicy
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from wsfleet import validation

CONNECTION_ID_PATTERN = rf"^[A-Za-z0-9._:-]{{1,{validation.MAX_CONNECTION_ID_LENGTH}}}$"  # CONTRACT section 2

EVENT_SCHEMA = apigw.JsonSchema(
    schema=apigw.JsonSchemaVersion.DRAFT4,
    title="Event",
    type=apigw.JsonSchemaType.OBJECT,
    required=["event_type", "connection_id"],
    properties={
        "event_type": apigw.JsonSchema(type=apigw.JsonSchemaType.STRING, enum=["START", "STOP"]),
        "connection_id": apigw.JsonSchema(type=apigw.JsonSchemaType.STRING, pattern=CONNECTION_ID_PATTERN),
    },
    # A START must name its upstream; whatever a STOP carries besides is the router's call.
    one_of=[
        apigw.JsonSchema(
            properties={
                "event_type": apigw.JsonSchema(enum=["START"]),
                "ws_url": apigw.JsonSchema(
                    type=apigw.JsonSchemaType.STRING, min_length=1, max_length=validation.MAX_WS_URL_LENGTH
                ),
            },
            required=["ws_url"],
        ),
        apigw.JsonSchema(properties={"event_type": apigw.JsonSchema(enum=["STOP"])}),
    ],
)

# API Gateway cannot quote its own validation detail safely into JSON, so the body it
# refuses gets this fixed sentence; the router's finer codes apply to what gets through.
INVALID_EVENT_MESSAGE = (
    'The request body is not a valid event: a JSON object with "event_type" "START", '
    '"connection_id" and "ws_url", or "event_type" "STOP" and "connection_id"; '
    f"connection_id is 1 to {validation.MAX_CONNECTION_ID_LENGTH} characters of A-Z, a-z, 0-9, "
    "'.', '_', ':' or '-'."
)


def _error_body(code: str, message_expression: str) -> dict[str, str]:
    # message_expression is a quoted JSON string or an API Gateway variable that yields one.
    return {"application/json": f'{{"error": "{code}", "message": {message_expression}}}'}


class EventsApi(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        handler: lambda_.IFunction,
        api_name: str,
        stage_name: str,
        rate_limit: int,
        burst_limit: int,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
        tracing_enabled: bool,
    ) -> None:
        """``tracing_enabled``: the stage samples requests for X-Ray and passes the trace
        header on to the router, where a START's trace starts."""
        super().__init__(scope, id)
        access_logs = logs.LogGroup(self, "AccessLogs", retention=log_retention, removal_policy=removal_policy)
        self.rest_api = apigw.RestApi(
            self,
            "Api",
            # Unique per environment: API Gateway's metrics are keyed by this name.
            rest_api_name=api_name,
            description="wsfleet desired-state events",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            default_method_options=apigw.MethodOptions(authorization_type=apigw.AuthorizationType.IAM),
            # Execution logs need the region-wide API Gateway logging role (see docs/stacks.md).
            # Every environment in the account sets it, so deleting one stack must never
            # delete the role the others still log through.
            cloud_watch_role=True,
            cloud_watch_role_removal_policy=RemovalPolicy.RETAIN,
            deploy_options=apigw.StageOptions(
                stage_name=stage_name,
                throttling_rate_limit=rate_limit,
                throttling_burst_limit=burst_limit,
                tracing_enabled=tracing_enabled,
                logging_level=apigw.MethodLoggingLevel.ERROR,
                access_log_destination=apigw.LogGroupLogDestination(access_logs),
                access_log_format=apigw.AccessLogFormat.json_with_standard_fields(
                    caller=True,
                    http_method=True,
                    ip=True,
                    protocol=True,
                    request_time=True,
                    resource_path=True,
                    response_length=True,
                    status=True,
                    user=True,
                ),
            ),
        )
        validator = self.rest_api.add_request_validator(
            "Validator", validate_request_body=True, validate_request_parameters=True
        )
        event_model = self.rest_api.add_model(
            "EventModel", content_type="application/json", model_name="Event", schema=EVENT_SCHEMA
        )
        integration = apigw.LambdaIntegration(handler, allow_test_invoke=False)

        self.rest_api.root.add_resource("events").add_method(
            "POST",
            integration,
            request_validator=validator,
            request_models={"application/json": event_model},
        )
        connection = self.rest_api.root.add_resource("connections").add_resource("{connection_id}")
        for method in ("GET", "DELETE"):
            connection.add_method(
                method,
                integration,
                request_validator=validator,
                request_parameters={"method.request.path.connection_id": True},
            )
        # The paging parameters are optional and the router checks their values (400):
        # declared here so that the API documents them, not required.
        connection.add_resource("messages").add_method(
            "GET",
            integration,
            request_validator=validator,
            request_parameters={
                "method.request.path.connection_id": True,
                "method.request.querystring.after_seq": False,
                "method.request.querystring.limit": False,
            },
        )

        self.rest_api.add_gateway_response(
            "InvalidBody",
            type=apigw.ResponseType.BAD_REQUEST_BODY,
            templates=_error_body("invalid_request", json.dumps(INVALID_EVENT_MESSAGE)),
        )
        self.rest_api.add_gateway_response(
            "Default4xx",
            type=apigw.ResponseType.DEFAULT_4_XX,
            templates=_error_body("request_rejected", "$context.error.messageString"),
        )
        self.rest_api.add_gateway_response(
            "Default5xx",
            type=apigw.ResponseType.DEFAULT_5_XX,
            templates=_error_body("gateway_error", "$context.error.messageString"),
        )
