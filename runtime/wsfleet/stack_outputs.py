"""Names of the stack outputs that ``wsfleet --stack`` finds things by, shared by the
stacks (which declare them) and the operators' CLI (which reads them), so that the two
cannot drift apart. Fixed ids, never CDK's generated ones."""

# The service stack.
API_URL = "ApiUrl"
WORKER_LOG_GROUP_NAME = "WorkerLogGroupName"  # wsfleet logs: the connection's lines
ROUTER_LOG_GROUP_NAME = "RouterLogGroupName"

# The stateful stack.
CONNECTIONS_TABLE_NAME = "ConnectionsTableName"
SESSIONS_TABLE_NAME = "SessionsTableName"
MESSAGES_TABLE_NAME = "MessagesTableName"
MESSAGES_BUCKET_NAME = "MessagesBucketName"
MESSAGES_STREAM_NAME = "MessagesStreamName"  # only where SINK has kinesis
START_QUEUE_URL = "StartQueueUrl"
# Only where SINK has firehose.
MESSAGES_DELIVERY_STREAM_NAME = "MessagesDeliveryStreamName"
DELIVERY_BUCKET_NAME = "DeliveryBucketName"
DELIVERY_DATABASE_NAME = "DeliveryDatabaseName"
# Only where the reference consumer is deployed.
CONSUMER_BUCKET_NAME = "ConsumerBucketName"
CONSUMER_TABLE_NAME = "ConsumerTableName"
