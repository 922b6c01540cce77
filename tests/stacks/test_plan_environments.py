"""``wsfleet plan`` sizes each environment from its file (environments/<name>.toml), as
the stacks do, reading the settings it needs with defaults of its own declaration: what
it reads must agree with the stacks' checked settings and with what they synthesize
(target tracking, the scaling ceiling, subnets, NAT gateways, the API's rate, a deploy's
task ceiling, NAT addresses, warm throughput)."""

from __future__ import annotations

import ipaddress

from wsfleet import schema
from wsfleet.plan import limits as plan_limits
from wsfleet.plan import environments as plan


def test_the_plan_mirrors_each_environments_settings(env):
    assert plan.load(env.settings.name) == env.settings.plan_settings


def test_the_plan_mirrors_what_the_stacks_synthesize(env):
    mirrored = plan.load(env.settings.name)
    t = env.service_template
    # Target tracking on ActiveConnections per task, between min and max workers.
    (policy,) = t.find_resources("AWS::ApplicationAutoScaling::ScalingPolicy").values()
    tracking = policy["Properties"]["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["TargetValue"] == mirrored["target_per_worker"]
    (target,) = t.find_resources("AWS::ApplicationAutoScaling::ScalableTarget").values()
    assert (target["Properties"]["MinCapacity"], target["Properties"]["MaxCapacity"]) == (
        mirrored["min_workers"], mirrored["max_workers"])
    # A rolling deploy runs up to twice the tasks.
    services = [r for r in t.find_resources("AWS::ECS::Service").values()]
    assert [s["Properties"]["DeploymentConfiguration"]["MaximumPercent"] for s in services] == [
        plan_limits.DEPLOY_FACTOR * 100]
    # The workers' subnets: one per AZ, each of the size the plan counts addresses in.
    private = [
        r["Properties"] for r in t.find_resources("AWS::EC2::Subnet").values()
        if not r["Properties"].get("MapPublicIpOnLaunch")
    ]
    assert len(private) == mirrored["azs"]
    for subnet in private:
        assert ipaddress.ip_network(subnet["CidrBlock"]).prefixlen == mirrored["worker_subnet_mask"]
    gateways = t.find_resources("AWS::EC2::NatGateway").values()
    assert len(gateways) == mirrored["nat_gateways"]
    # Each gateway's addresses: its primary Elastic IP and its secondary ones, each an EIP
    # of the stack's own.
    eips = t.find_resources("AWS::EC2::EIP")
    assert len(eips) == mirrored["nat_gateways"] * mirrored["nat_addresses_per_gateway"]
    for gateway in gateways:
        secondary = gateway["Properties"].get("SecondaryAllocationIds", [])
        assert len(secondary) == mirrored["nat_addresses_per_gateway"] - 1
        assert {ref["Fn::GetAtt"][0] for ref in secondary} <= set(eips)
    # The API stage's throttling: the rate the plan STARTs connections at.
    (stage,) = t.find_resources("AWS::ApiGateway::Stage").values()
    (method,) = stage["Properties"]["MethodSettings"]
    assert (method["ThrottlingRateLimit"], method["ThrottlingBurstLimit"]) == (
        mirrored["api_rate_limit"], mirrored["api_burst_limit"])


def test_the_connections_table_and_its_owner_index_are_warmed_as_the_plan_sizes_them(env):
    mirrored = plan.load(env.settings.name)
    (table,) = [
        r["Properties"] for r in env.stateful_template.find_resources("AWS::DynamoDB::Table").values()
        if any(i["IndexName"] == schema.OWNER_INDEX for i in r["Properties"].get("GlobalSecondaryIndexes", []))
    ]
    (index,) = [i for i in table["GlobalSecondaryIndexes"] if i["IndexName"] == schema.OWNER_INDEX]

    def warm(props):
        w = props.get("WarmThroughput")
        return w and {"read": w["ReadUnitsPerSecond"], "write": w["WriteUnitsPerSecond"]}

    assert warm(table) == mirrored["connections_warm"]
    assert warm(index) == mirrored["owner_index_warm"]
