"""The queue of START hints (``{"connection_id": ...}``) and its dead-letter queue.

A hint only speeds up a start: the workers' orphan scan finds every STARTED connection
without one. So the queue keeps hints for a day, and a hint that keeps failing is moved
aside for an operator instead of being retried for ever.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_sqs as sqs
from constructs import Construct

QUEUE_LOGICAL_ID = "StartQueue"
DEAD_LETTER_LOGICAL_ID = "StartDeadLetterQueue"


class StartQueue(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        visibility_timeout: Duration,
        max_receive_count: int,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, id)
        self.dead_letter_queue = sqs.Queue(
            self,
            "DeadLetter",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
            removal_policy=removal_policy,
        )
        self.queue = sqs.Queue(
            self,
            "Queue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            visibility_timeout=visibility_timeout,
            retention_period=Duration.days(1),
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.dead_letter_queue, max_receive_count=max_receive_count),
            removal_policy=removal_policy,
        )
        self.queue.node.default_child.override_logical_id(QUEUE_LOGICAL_ID)
        self.dead_letter_queue.node.default_child.override_logical_id(DEAD_LETTER_LOGICAL_ID)
