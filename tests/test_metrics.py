"""Worker metrics: what is published, under the identity the stack scales on."""

import asyncio

import boto3
import pytest

from wsfleet import metrics_names as names
from wsfleet.aws import Aws
from wsfleet.config import WorkerConfig
from wsfleet.logs import JsonLogger
from wsfleet.metrics import Counters, metric_data
from wsfleet.worker.lifecycle import Worker


def test_counter_deltas_report_only_what_changed_since_the_last_publish():
    c = Counters()
    c.add(names.MESSAGES_STORED, 5)
    assert c.take_deltas()[names.MESSAGES_STORED] == 5
    c.add(names.MESSAGES_STORED, 2)
    assert c.take_deltas()[names.MESSAGES_STORED] == 2
    assert c.total(names.MESSAGES_STORED) == 7


def test_an_unknown_counter_is_refused():
    with pytest.raises(KeyError):
        Counters().add("Typo")


def test_metric_data_carries_the_gauge_and_counters_with_the_service_dimension():
    data = metric_data(service_name="svc", active_connections=3, deltas={names.RECONNECTS: 1})
    assert data[0] == {
        "MetricName": "ActiveConnections",
        "Dimensions": [{"Name": "ServiceName", "Value": "svc"}],
        "Value": 3.0,
        "Unit": "Count",
    }
    assert {d["MetricName"] for d in data} == {"ActiveConnections", "Reconnects"}


def test_the_worker_publishes_active_connections_to_cloudwatch(emulator, aws_env):
    cfg = WorkerConfig.from_env({**aws_env, "SERVICE_NAME": "wsfleet-test", "METRICS_NAMESPACE": "WsFleetTest"})

    async def publish():
        aws = Aws(cfg, threads=2)
        await Worker(cfg, "w1", aws=aws, log=JsonLogger()).publish_metrics_once()
        aws.close()

    asyncio.run(publish())
    cw = boto3.client("cloudwatch", endpoint_url=emulator.endpoint_url, region_name="us-east-1")
    metrics = cw.list_metrics(Namespace="WsFleetTest", MetricName="ActiveConnections")["Metrics"]
    assert {"Name": "ServiceName", "Value": "wsfleet-test"} in metrics[0]["Dimensions"]
