"""``wsfleet plan`` sizes each environment from a copy of its settings (the runtime cannot
import stacks): the copy must agree with app.py's settings and with what the stacks
synthesize (target tracking, the scaling ceiling, subnets, NAT gateways, the API's rate,
a deploy's task ceiling)."""

from __future__ import annotations

import ipaddress

from wsfleet import plan, plan_limits


def test_the_plan_mirrors_each_environments_settings(env):
    s, mirrored = env.settings, plan.ENVIRONMENTS[env.settings.name]
    assert mirrored == {
        **mirrored,
        "max_per_worker": s.max_connections_per_worker,
        "target_per_worker": s.target_connections_per_worker,
        "shards": s.state_shards,
        "checkpoint_s": s.checkpoint_seconds,
        "message_ttl_days": s.message_ttl_days,
        "min_workers": s.min_workers,
        "max_workers": s.max_workers,
        "worker_cpu": s.worker_cpu,
        "worker_memory_mib": s.worker_memory_mib,
        "api_rate_limit": s.api_rate_limit,
        "api_burst_limit": s.api_burst_limit,
        "nat_gateways": s.nat_gateways,
        "lease_s": s.lease_seconds,
        "spot": s.use_fargate_spot,
    }


def test_the_plan_mirrors_what_the_stacks_synthesize(env):
    mirrored = plan.ENVIRONMENTS[env.settings.name]
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
    assert len(t.find_resources("AWS::EC2::NatGateway")) == mirrored["nat_gateways"]
    # The API stage's throttling: the rate the plan STARTs connections at.
    (stage,) = t.find_resources("AWS::ApiGateway::Stage").values()
    (method,) = stage["Properties"]["MethodSettings"]
    assert (method["ThrottlingRateLimit"], method["ThrottlingBurstLimit"]) == (
        mirrored["api_rate_limit"], mirrored["api_burst_limit"])
