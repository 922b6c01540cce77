"""Where the fleet is: the AWS session, and the API URL and table names, from the
environment the worker takes or from a stack's outputs (``--stack``), read under the
fixed ids that ``wsfleet.stack_outputs`` shares with the stacks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from .. import config, settings_spec, stack_outputs
from .errors import CliError

# Table -> (its stack output, its variable).
_TABLES = {
    "connections": (stack_outputs.CONNECTIONS_TABLE_NAME, settings_spec.TABLE_NAME),
    "sessions": (stack_outputs.SESSIONS_TABLE_NAME, settings_spec.SESSIONS_TABLE_NAME),
    "messages": (stack_outputs.MESSAGES_TABLE_NAME, settings_spec.MESSAGES_TABLE_NAME),
}


# The environment, named once: its stacks are wsfleet-<env>-service (the API) and
# wsfleet-<env>-stateful (the tables, the stream), as app.py names them.
ENV_VARIABLE = "WSFLEET_ENV"
API_VARIABLE = "WSFLEET_API"  # the API's URL, for a fleet not found through its stacks
SERVICE, STATEFUL = "service", "stateful"


def stack_name(environment: str, part: str) -> str:
    return f"wsfleet-{environment}-{part}"


def stack_for(part: str, stack: str | None, environment: str | None, env: Mapping[str, str], *, specific: str = "") -> str | None:
    """The stack to read ``part``'s outputs from: flags before variables, the more specific
    before the less. ``--stack``, then ``--env``; then None where the variable ``specific``
    (WSFLEET_API, TABLE_NAME, MESSAGES_STREAM_NAME) is set, which names the thing itself;
    then WSFLEET_ENV; else None."""
    if stack:
        return stack
    if environment:
        return stack_name(environment, part)
    if specific and env.get(specific, "").strip():
        return None
    named = env.get(ENV_VARIABLE, "").strip()
    return stack_name(named, part) if named else None


def api_url(api: str | None, stack: str | None, environment: str | None, session: Any, env: Mapping[str, str]) -> str:
    """The API's URL: ``--api``, else the ``ApiUrl`` output of the service stack that
    ``--stack``, ``--env`` or WSFLEET_ENV names, else WSFLEET_API."""
    if api:
        return api
    name = stack_for(SERVICE, stack, environment, env, specific=API_VARIABLE)
    if name:
        return api_url_of(stack_outputs_of(client(session, "cloudformation", env), name), name)
    if env.get(API_VARIABLE, "").strip():
        return env[API_VARIABLE].strip()
    raise CliError(
        f"which fleet? Name it once: --env NAME (or {ENV_VARIABLE}=NAME) reads the API from the stack "
        f"wsfleet-NAME-service; or give --api URL (or {API_VARIABLE}=URL), or --stack NAME"
    )


def aws_session(region: str | None, env: Mapping[str, str]) -> boto3.session.Session:
    """``region`` (--region), else AWS_REGION, else the default chain's."""
    region = region or env.get(settings_spec.AWS_REGION) or env.get(settings_spec.AWS_DEFAULT_REGION) or None
    return boto3.session.Session(region_name=region)


# An operator waits seconds, not minutes: botocore's defaults (60 s to connect, 60 to read,
# several retries) kept `status` silent 26 s on an endpoint out of reach.
CLIENT_CONFIG = Config(connect_timeout=3, read_timeout=10, retries={"mode": "standard", "max_attempts": 2})


def client(session: boto3.session.Session, service: str, env: Mapping[str, str]) -> Any:
    return session.client(service, endpoint_url=env.get(settings_spec.AWS_ENDPOINT_URL) or None, config=CLIENT_CONFIG)


def stack_outputs_of(cfn: Any, stack_name: str) -> dict[str, str]:
    """A stack's outputs by key (DescribeStacks)."""
    try:
        (stack,) = cfn.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as error:
        if "does not exist" in error.response.get("Error", {}).get("Message", ""):
            raise CliError(f"stack {stack_name} does not exist in {cfn.meta.region_name}") from None
        raise
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def api_url_of(outputs: Mapping[str, str], stack_name: str) -> str:
    """The service stack's API stage URL."""
    if not outputs.get(stack_outputs.API_URL):
        raise CliError(
            f"stack {stack_name} has no API endpoint output: name the service stack (wsfleet-<env>-service), "
            f"deployed with its {stack_outputs.API_URL} output"
        )
    return outputs[stack_outputs.API_URL]


@dataclass(frozen=True)
class Tables:
    connections: str
    sessions: str
    messages: str
    state_shards: int  # FREE#<shard> partitions of by_owner to read (the stack's STATE_SHARDS)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Tables":
        names = {table: env.get(variable, "").strip() for table, (_, variable) in _TABLES.items()}
        return cls(**names, state_shards=config.state_shards(env))

    @classmethod
    def from_outputs(cls, outputs: Mapping[str, str], stack_name: str, env: Mapping[str, str]) -> "Tables":
        """The stateful stack's table names; a stack has all three outputs or is not one."""
        missing = [output for output, _ in _TABLES.values() if not outputs.get(output)]
        if missing:
            raise CliError(
                f"stack {stack_name} has no table outputs: name the stateful stack (wsfleet-<env>-stateful), "
                f"deployed with its {', '.join(missing)} outputs"
            )
        names = {table: outputs[output] for table, (output, _) in _TABLES.items()}
        return cls(**names, state_shards=config.state_shards(env))

    def need(self, *which: str) -> None:
        """Stop, naming the variables to set, unless the tables ``which`` are named."""
        missing = [_TABLES[table][1] for table in which if not getattr(self, table)]
        if missing:
            raise CliError(
                f"{', '.join(missing)} not set: name the fleet with --env NAME (or {ENV_VARIABLE}=NAME), pass --stack, "
                "or export the fleet's environment"
            )
