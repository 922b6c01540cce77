"""Reading a synthesized service stack's IAM policies, for the grant tests."""

from __future__ import annotations


def statements(env, role) -> list[dict]:
    """Every statement of the service stack's policies attached to ``role``."""
    ref = env.service.resolve(role.role_name)
    return [
        statement
        for policy in env.service_template.find_resources("AWS::IAM::Policy").values()
        if ref in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def actions(statement: dict) -> list[str]:
    return [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]
