"""The VPC the workers run in.

Why private subnets behind NAT: every worker holds outbound WebSockets to arbitrary
``wss://`` upstreams on the internet, so VPC endpoints alone cannot serve it, and tasks
must take no inbound traffic at all. The choices, at us-east-1 prices:

* public subnets with a public IP per task and a no-ingress security group: no NAT
  charge, but $0.005/h ($3.65/month) per task for its public IPv4 address, and a task
  is one security-group mistake away from being reachable;
* private subnets with NAT gateways (chosen): $0.045/h ($32.85/month) per gateway plus
  $0.045/GB processed; one gateway in dev, one per AZ in prod so that losing an AZ never
  cuts the other AZ's egress;
* interface endpoints for SQS, CloudWatch, Logs, X-Ray and ECR: $0.01/h per AZ each
  ($7.30/month), about $88/month for six services in two AZs, more than the NAT data
  charge they would save at this fleet's volume, so none.

The gateway endpoints for DynamoDB and S3 are free and take the heaviest AWS traffic
(lease renewals, message writes, image layers) off the NAT's per-GB charge.

Sizes scale with the settings: a NAT address holds about 55,000 simultaneous connections
to one destination IP and port, so each gateway gets ``addresses_per_gateway`` Elastic IP
addresses (its primary and secondary ones, ``SecondaryAllocationIds``); the worker subnets
are ``/worker_subnet_mask`` each, an address per task and twice the tasks during a deploy.
``wsfleet plan`` checks both against the connections (stacks.synth.check_plan).
"""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct


class Network(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        nat_gateways: int,
        addresses_per_gateway: int,
        worker_subnet_mask: int,
        availability_zones: int,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, id)
        flow_logs = logs.LogGroup(self, "FlowLogs", retention=log_retention, removal_policy=removal_policy)
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=availability_zones,
            nat_gateways=nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(
                    name="workers", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=worker_subnet_mask
                ),
            ],
            gateway_endpoints={
                "DynamoDb": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.DYNAMODB),
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3),
            },
            # Rejected flows only: they are what shows a probe or a security-group
            # mistake, for a fraction of the cost of logging every accepted flow.
            flow_logs={
                "Rejected": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
                    traffic_type=ec2.FlowLogTrafficType.REJECT,
                )
            },
        )
        self.worker_subnets = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        self.secondary_addresses = self._secondary_addresses(addresses_per_gateway - 1)

    def _secondary_addresses(self, count: int) -> list[ec2.CfnEIP]:
        """``count`` more Elastic IP addresses on each NAT gateway the VPC made (through
        the escape hatch: ec2.Vpc gives a gateway only its primary one)."""
        made = []
        for subnet in self.vpc.public_subnets:
            gateway = subnet.node.try_find_child("NATGateway")
            if gateway is None or not count:
                continue
            addresses = [ec2.CfnEIP(subnet, f"SecondaryEIP{i + 1}", domain="vpc") for i in range(count)]
            gateway.secondary_allocation_ids = [address.attr_allocation_id for address in addresses]
            made += addresses
        return made
