"""The stateful stack: the connections, sessions and messages tables shaped exactly as
wsfleet.schema says (CONTRACT section 4), the messages bucket, data kept in prod, and a
START queue with a dead-letter queue, encryption and TLS only."""

from __future__ import annotations

import json

from aws_cdk.assertions import Match, Template

from stacks.constructs.consumer import CONSUMER_TABLE_LOGICAL_ID
from stacks.constructs.messages_bucket import ABORT_INCOMPLETE_UPLOADS_AFTER, MESSAGES_BUCKET_LOGICAL_ID
from stacks.constructs.queue import DEAD_LETTER_LOGICAL_ID, QUEUE_LOGICAL_ID
from stacks.constructs.tables import CONNECTIONS_LOGICAL_ID, MESSAGES_LOGICAL_ID, SESSIONS_LOGICAL_ID
from stacks.settings import EnvironmentSettings
from stacks.stateful_stack import MAX_HINT_RECEIVES, StatefulStack
from wsfleet import schema

WORKER_LONG_POLL_SECONDS = 10  # the worker's ReceiveMessage WaitTimeSeconds


def _spec_as_cloudformation(spec: dict) -> dict:
    """The CreateTable spec's key fields as CloudFormation properties."""
    props = {
        "KeySchema": spec["KeySchema"],
        "AttributeDefinitions": Match.array_with(spec["AttributeDefinitions"]),
        "BillingMode": spec["BillingMode"],
    }
    if "GlobalSecondaryIndexes" in spec:
        props["GlobalSecondaryIndexes"] = spec["GlobalSecondaryIndexes"]
    return props


def test_connections_table_is_the_schema_spec(env):
    env.stateful_template.has_resource_properties(
        "AWS::DynamoDB::Table", _spec_as_cloudformation(schema.connections_table_spec("any"))
    )


def test_messages_table_is_the_schema_spec_with_ttl(env):
    env.stateful_template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            **_spec_as_cloudformation(schema.messages_table_spec("any")),
            "TimeToLiveSpecification": {"AttributeName": schema.MESSAGE_TTL_ATTRIBUTE, "Enabled": True},
        },
    )


def _table(env, logical_id: str) -> dict:
    return env.stateful_template.to_json()["Resources"][logical_id]["Properties"]


def test_sessions_table_is_the_schema_spec_with_ttl(env):
    env.stateful_template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            **_spec_as_cloudformation(schema.sessions_table_spec("any")),
            "TimeToLiveSpecification": {"AttributeName": schema.SESSION_TTL, "Enabled": True},
        },
    )


def test_owner_index_is_by_owner_key_with_the_desired_state(env):
    table = _table(env, CONNECTIONS_LOGICAL_ID)
    assert {"AttributeName": schema.OWNER_KEY, "AttributeType": "S"} in table["AttributeDefinitions"]
    # (its warm throughput is the plan's: test_plan_environments)
    assert [{k: v for k, v in i.items() if k != "WarmThroughput"} for i in table["GlobalSecondaryIndexes"]] == [
        {
            "IndexName": schema.OWNER_INDEX,
            "KeySchema": [{"AttributeName": schema.OWNER_KEY, "KeyType": "HASH"}],
            "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": [schema.DESIRED_STATE]},
        }
    ]


def test_ring_index_orders_the_sessions_by_id_with_their_load_and_never_their_expiry(env):
    table = _table(env, SESSIONS_LOGICAL_ID)
    assert table["KeySchema"] == [{"AttributeName": schema.SESSION_ID, "KeyType": "HASH"}]
    assert {"AttributeName": schema.RING, "AttributeType": "S"} in table["AttributeDefinitions"]
    assert table["GlobalSecondaryIndexes"] == [
        {
            "IndexName": schema.RING_INDEX,
            "KeySchema": [
                {"AttributeName": schema.RING, "KeyType": "HASH"},
                {"AttributeName": schema.SESSION_ID, "KeyType": "RANGE"},
            ],
            # A renewal changes no key, and nothing projected unless the load or state did:
            # the expiry is never projected, or every heartbeat would write to the index.
            "Projection": {
                "ProjectionType": "INCLUDE",
                "NonKeyAttributes": [schema.SESSION_STATE, schema.ACTIVE, schema.MAX_CONNECTIONS, schema.DRAINING],
            },
        }
    ]
    assert table["TimeToLiveSpecification"] == {"AttributeName": schema.SESSION_TTL, "Enabled": True}


def test_markers_index_is_sparse_on_skipped_keys_only(env):
    table = _table(env, MESSAGES_LOGICAL_ID)
    assert {"AttributeName": schema.SKIPPED, "AttributeType": "S"} in table["AttributeDefinitions"]
    # Only skip markers carry `skipped`: the index holds them and nothing else, and GET
    # counts a connection's markers from it without reading its messages.
    assert table["GlobalSecondaryIndexes"] == [
        {
            "IndexName": schema.MARKERS_INDEX,
            "KeySchema": [
                {"AttributeName": schema.MSG_PK, "KeyType": "HASH"},
                {"AttributeName": schema.SKIPPED, "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        }
    ]


def test_tables_and_queues_keep_fixed_logical_ids(env):
    resources = env.stateful_template.to_json()["Resources"]
    assert resources[CONNECTIONS_LOGICAL_ID]["Type"] == "AWS::DynamoDB::Table"
    assert resources[SESSIONS_LOGICAL_ID]["Type"] == "AWS::DynamoDB::Table"
    assert resources[MESSAGES_LOGICAL_ID]["Type"] == "AWS::DynamoDB::Table"
    assert resources[QUEUE_LOGICAL_ID]["Type"] == "AWS::SQS::Queue"
    assert resources[DEAD_LETTER_LOGICAL_ID]["Type"] == "AWS::SQS::Queue"
    assert resources[MESSAGES_BUCKET_LOGICAL_ID]["Type"] == "AWS::S3::Bucket"


def test_prod_retains_tables_with_deletion_protection_and_point_in_time_recovery(prod):
    tables = prod.stateful_template.find_resources("AWS::DynamoDB::Table")
    assert set(tables) == {CONNECTIONS_LOGICAL_ID, SESSIONS_LOGICAL_ID, MESSAGES_LOGICAL_ID}
    for table in tables.values():
        assert table["DeletionPolicy"] == "Retain"
        assert table["UpdateReplacePolicy"] == "Retain"
        assert table["Properties"]["DeletionProtectionEnabled"] is True
        assert table["Properties"]["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert prod.stateful.termination_protection is True


def test_dev_tables_are_disposable(dev):
    tables = dev.stateful_template.find_resources("AWS::DynamoDB::Table")
    # dev runs the reference consumer: its state table is dev's too.
    assert set(tables) == {CONNECTIONS_LOGICAL_ID, SESSIONS_LOGICAL_ID, MESSAGES_LOGICAL_ID, CONSUMER_TABLE_LOGICAL_ID}
    for table in tables.values():
        assert table["DeletionPolicy"] == "Delete"
        assert table["Properties"]["DeletionProtectionEnabled"] is False
    assert dev.stateful.termination_protection is False


def test_start_queue_redrives_to_its_dead_letter_queue(env):
    env.stateful_template.has_resource_properties(
        "AWS::SQS::Queue",
        {
            "RedrivePolicy": {
                "deadLetterTargetArn": {"Fn::GetAtt": [DEAD_LETTER_LOGICAL_ID, "Arn"]},
                "maxReceiveCount": MAX_HINT_RECEIVES,
            }
        },
    )


def test_both_queues_are_encrypted_and_refuse_plain_http(env):
    queues = env.stateful_template.find_resources("AWS::SQS::Queue")
    assert set(queues) == {QUEUE_LOGICAL_ID, DEAD_LETTER_LOGICAL_ID}
    for queue in queues.values():
        assert queue["Properties"]["SqsManagedSseEnabled"] is True
    for logical_id in queues:
        env.stateful_template.has_resource_properties(
            "AWS::SQS::QueuePolicy",
            {
                "Queues": [{"Ref": logical_id}],
                "PolicyDocument": {
                    "Statement": Match.array_with(
                        [
                            Match.object_like(
                                {
                                    "Effect": "Deny",
                                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                                }
                            )
                        ]
                    )
                },
            },
        )


def test_hint_visibility_outlasts_the_long_poll_and_a_lease(env):
    queue = env.stateful_template.to_json()["Resources"][QUEUE_LOGICAL_ID]["Properties"]
    assert queue["VisibilityTimeout"] > WORKER_LONG_POLL_SECONDS
    assert queue["VisibilityTimeout"] >= env.settings.lease_seconds


def test_service_stack_deploys_after_the_stateful_stack(env):
    artifact = env.assembly.get_stack_by_name(env.service.stack_name)
    assert env.stateful.artifact_id in [d.id for d in artifact.dependencies]


# --- the messages bucket ------------------------------------------------------------------


def _bucket(env) -> dict:
    return env.stateful_template.to_json()["Resources"][MESSAGES_BUCKET_LOGICAL_ID]


def test_messages_bucket_is_encrypted_private_and_owner_only(env):
    props = _bucket(env)["Properties"]
    assert props["BucketEncryption"] == {
        "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
    }
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert props["OwnershipControls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    # A replay rewrites the same key: no versions to keep.
    assert "VersioningConfiguration" not in props


def test_messages_bucket_refuses_plain_http_and_old_tls(env):
    policies = env.stateful_template.find_resources(
        "AWS::S3::BucketPolicy", {"Properties": {"Bucket": {"Ref": MESSAGES_BUCKET_LOGICAL_ID}}}
    )
    assert len(policies) == 1
    statements = next(iter(policies.values()))["Properties"]["PolicyDocument"]["Statement"]
    bucket_and_objects = [
        {"Fn::GetAtt": [MESSAGES_BUCKET_LOGICAL_ID, "Arn"]},
        {"Fn::Join": ["", [{"Fn::GetAtt": [MESSAGES_BUCKET_LOGICAL_ID, "Arn"]}, "/*"]]},
    ]
    denies = [s for s in statements if s["Effect"] == "Deny"]
    assert {
        "Effect": "Deny",
        "Principal": {"AWS": "*"},
        "Action": "s3:*",
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        "Resource": bucket_and_objects,
    } in denies
    assert {
        "Effect": "Deny",
        "Principal": {"AWS": "*"},
        "Action": "s3:*",
        "Condition": {"NumericLessThan": {"s3:TlsVersion": 1.2}},
        "Resource": bucket_and_objects,
    } in denies
    # Nothing in the bucket policy lets anyone in: the roles' own policies do.
    for allow in (s for s in statements if s["Effect"] == "Allow"):
        assert "Fn::GetAtt" in json.dumps(allow["Principal"]), allow  # only the dev auto-delete role


def test_messages_bucket_objects_expire_with_the_message_ttl(env):
    rules = _bucket(env)["Properties"]["LifecycleConfiguration"]["Rules"]
    assert rules == [
        {
            "Id": "messages",
            "Status": "Enabled",
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": ABORT_INCOMPLETE_UPLOADS_AFTER.to_days()},
            "ExpirationInDays": env.settings.message_ttl_days,
        }
    ]
    assert env.settings.message_ttl_days > 0


def test_messages_bucket_keeps_objects_for_ever_when_messages_have_no_ttl(new_app):
    app = new_app("dev")
    stack = StatefulStack(app, "keep-stateful", settings=EnvironmentSettings(name="keep", message_ttl_days=0))
    bucket = Template.from_stack(stack).to_json()["Resources"][MESSAGES_BUCKET_LOGICAL_ID]
    (rule,) = bucket["Properties"]["LifecycleConfiguration"]["Rules"]
    assert "ExpirationInDays" not in rule and "Expiration" not in json.dumps(rule)
    # Incomplete uploads go all the same.
    assert rule["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}


def test_prod_retains_the_messages_bucket(prod):
    bucket = _bucket(prod)
    assert (bucket["DeletionPolicy"], bucket["UpdateReplacePolicy"]) == ("Retain", "Retain")
    assert not prod.stateful_template.find_resources("Custom::S3AutoDeleteObjects")


def test_dev_messages_bucket_is_emptied_and_deleted_with_the_stack(dev):
    bucket = _bucket(dev)
    assert bucket["DeletionPolicy"] == "Delete"
    auto_delete = dev.stateful_template.find_resources("Custom::S3AutoDeleteObjects")
    assert {"Ref": MESSAGES_BUCKET_LOGICAL_ID} in [r["Properties"]["BucketName"] for r in auto_delete.values()]
