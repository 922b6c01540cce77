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
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, id)
        flow_logs = logs.LogGroup(self, "FlowLogs", retention=log_retention, removal_policy=removal_policy)
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=2,
            nat_gateways=nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(
                    name="workers", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=20
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
