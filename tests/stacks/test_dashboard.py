"""The operations dashboard: what it draws, read from the synthesized DashboardBody.

The body is a JSON document joined (``Fn::Join``) around references to other resources;
the tests rebuild it with a placeholder per reference and compare those references with
what the stacks resolve them to, never with generated logical ids.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from wsfleet import metrics, metrics_names, schema
from wsfleet.metrics import EMF_EVENT

NAMESPACE = metrics_names.DEFAULT_NAMESPACE


class Body:
    """A DashboardBody, parsed, with its references kept aside."""

    def __init__(self, join: dict) -> None:
        separator, parts = join["Fn::Join"]
        assert separator == ""
        self.references: dict[str, str] = {}  # placeholder -> the reference, as sorted JSON
        text = ""
        for part in parts:
            if isinstance(part, str):
                text += part
            else:
                placeholder = f"@ref{len(self.references)}@"
                self.references[placeholder] = json.dumps(part, sort_keys=True)
                text += placeholder
        self.document = json.loads(text)

    def widgets(self) -> list[dict]:
        return self.document["widgets"]

    def entries(self) -> list[list]:
        """Every line of every metric widget: a metric or an expression."""
        return [e for w in self.widgets() if w["type"] == "metric" for e in w["properties"].get("metrics", [])]

    def metrics(self, namespace: str, name: str) -> list[dict[str, str]]:
        """The dimensions of every line that draws ``namespace/name``, references
        replaced by what they refer to (sorted JSON)."""
        found = []
        for entry in self.entries():
            if entry[:2] == [namespace, name]:
                pairs = [part for part in entry[2:] if isinstance(part, str)]
                found.append({k: self.resolved(v) for k, v in zip(pairs[::2], pairs[1::2], strict=True)})
        return found

    def expressions(self) -> list[str]:
        return [e[0]["expression"] for e in self.entries() if isinstance(e[0], dict) and "expression" in e[0]]

    def resolved(self, text: str) -> str:
        return self.references.get(text, text)

    def placeholders_of(self, reference: Any) -> set[str]:
        wanted = json.dumps(reference, sort_keys=True)
        return {placeholder for placeholder, ref in self.references.items() if ref == wanted}


def _dashboard(env) -> tuple[str, dict]:
    found = env.service_template.find_resources("AWS::CloudWatch::Dashboard")
    assert len(found) == 1, f"expected one dashboard, found {sorted(found)}"
    return next(iter(found.items()))


def _body(env) -> Body:
    return Body(_dashboard(env)[1]["Properties"]["DashboardBody"])


def _ref(env, value: Any) -> str:
    """What a reference in the service stack resolves to, as sorted JSON."""
    return json.dumps(env.service.resolve(value), sort_keys=True)


def test_one_dashboard_per_environment_named_after_it(env):
    env.service_template.has_resource_properties(
        "AWS::CloudWatch::Dashboard", {"DashboardName": f"wsfleet-{env.settings.name}"}
    )
    _dashboard(env)


def test_the_dashboard_url_is_a_stack_output_naming_the_dashboard(env):
    logical_id, _ = _dashboard(env)
    outputs = env.service_template.find_outputs("DashboardUrl")
    assert len(outputs) == 1
    url = outputs["DashboardUrl"]["Value"]["Fn::Join"][1]
    assert {"Ref": logical_id} in url
    assert "#dashboards:name=" in "".join(p for p in url if isinstance(p, str))


def test_every_metric_the_worker_publishes_for_the_service_is_graphed(env):
    body = _body(env)
    service = {metrics_names.DIMENSION_SERVICE_NAME: env.settings.service_name}
    published = {
        d["MetricName"]
        for d in metrics.metric_data(
            service_name=env.settings.service_name,
            active_connections=1,
            unowned_connections=1,
            loop_lag_p99_ms=1.0,
            deltas={name: 1 for name in metrics_names.COUNTERS},
        )
    }
    # The stream's counts only where the stream is a sink (they stay at zero elsewhere).
    stream_only = {metrics_names.RECORDS_RESENT, metrics_names.RECORDS_THROTTLED}
    for name in published - (set() if env.settings.has_stream else stream_only):
        assert body.metrics(NAMESPACE, name), f"{name} is not on the dashboard"
        assert all(dims == service for dims in body.metrics(NAMESPACE, name))
    if not env.settings.has_stream:
        assert not any(body.metrics(NAMESPACE, name) for name in stream_only)
    assert {metrics_names.UNOWNED_CONNECTIONS, metrics_names.LOOP_LAG_P99} | stream_only <= published


def test_active_connections_are_drawn_on_average_and_in_total_and_per_worker_from_the_logs(env):
    body = _body(env)
    service = {metrics_names.DIMENSION_SERVICE_NAME: env.settings.service_name}
    assert body.metrics(NAMESPACE, metrics_names.ACTIVE_CONNECTIONS) == [service, service]  # average, total
    assert not [e for e in body.expressions() if NAMESPACE in e]  # no search of a per-task metric left
    # Per worker: a Logs Insights table over the worker's log group, reading the EMF lines'
    # WorkerId property (the metrics have no per-worker dimension).
    (query,) = [w for w in body.widgets() if w["type"] == "log"]
    text = query["properties"]["query"]
    assert f'filter event = "{EMF_EVENT}"' in text
    assert f"by {metrics_names.DIMENSION_WORKER_ID}" in text and metrics_names.ACTIVE_CONNECTIONS in text
    (source,) = re.findall(r"SOURCE '(@ref\d+@)'", text)
    log_groups = env.service_template.find_resources("AWS::Logs::LogGroup")
    worker_group = next(k for k in log_groups if k.startswith("Workers"))
    assert worker_group in body.resolved(source)  # the worker service's log group, by reference


def _widget_drawing(env, metric: str) -> dict:
    (widget,) = [
        w for w in _body(env).widgets() if any(e[:2] == [NAMESPACE, metric] for e in w["properties"].get("metrics", []))
    ]
    return widget


def _drawn(widget: dict) -> set[str]:
    return {e[1] for e in widget["properties"]["metrics"] if e[0] == NAMESPACE}


@pytest.mark.parametrize(
    "metric, beside",
    [
        # The secret fetches beside the refusals that force some of them.
        (metrics_names.SECRET_FETCHES, metrics_names.UPSTREAM_REFUSALS),
        # Seqs users will not get, next to the frames the parser could not take.
        (metrics_names.SKIPPED_FRAMES, metrics_names.MALFORMED_FRAMES),
        # How many of the stored messages went to S3.
        (metrics_names.LARGE_FRAMES, metrics_names.MESSAGES_STORED),
    ],
)
def test_skip_markers_and_large_frames_are_drawn_beside_what_they_qualify(env, metric, beside):
    assert beside in _drawn(_widget_drawing(env, metric))


@pytest.mark.parametrize(
    "metric",
    [metrics_names.UNOWNED_CONNECTIONS, metrics_names.UNREACHABLE_CONNECTIONS, metrics_names.REFUSED_CONNECTIONS],
)
def test_the_unowned_unreachable_and_refused_graphs_draw_their_alarms_thresholds(env, metric):
    alarm = next(
        a["Properties"]
        for a in env.service_template.find_resources("AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("MetricName") == metric
    )
    widget = next(
        w
        for w in _body(env).widgets()
        if any(e[:2] == [NAMESPACE, metric] for e in w["properties"].get("metrics", []))
    )
    assert [a["value"] for a in widget["properties"]["annotations"]["horizontal"]] == [alarm["Threshold"]]


def test_the_upstream_metrics_are_graphed_for_the_service(env):
    """RefusedConnections is a gauge (the worker's count at publish time): drawn as the
    most on one worker, like its alarm; the others are counters, summed per minute."""
    body = _body(env)
    service = {metrics_names.DIMENSION_SERVICE_NAME: env.settings.service_name}
    stats = {}
    for widget in body.widgets():
        for entry in widget["properties"].get("metrics", []):
            if len(entry) > 2 and entry[0] == NAMESPACE and isinstance(entry[-1], dict):
                stats[entry[1]] = entry[-1].get("stat")
    for name in (metrics_names.UPSTREAM_REFUSALS, metrics_names.SECRET_FETCHES, metrics_names.MISSED_SEQS):
        assert body.metrics(NAMESPACE, name) == [service], name
        assert stats[name] == "Sum", name
    assert body.metrics(NAMESPACE, metrics_names.REFUSED_CONNECTIONS) == [service]
    assert stats[metrics_names.REFUSED_CONNECTIONS] == "Maximum"


def test_api_router_and_queues_are_graphed(env):
    body = _body(env)
    api = {"ApiName": f"wsfleet-{env.settings.name}-events"}
    for name in ("4XXError", "5XXError", "Latency"):
        assert api in body.metrics("AWS/ApiGateway", name)
    router = {"FunctionName": _ref(env, env.service.router.function.function_name)}
    for name in ("Errors", "Duration"):
        assert router in body.metrics("AWS/Lambda", name)
    queues = env.stateful.start_queue
    assert {"QueueName": _ref(env, queues.queue.queue_name)} in body.metrics("AWS/SQS", "ApproximateAgeOfOldestMessage")
    assert {"QueueName": _ref(env, queues.dead_letter_queue.queue_name)} in body.metrics(
        "AWS/SQS", "ApproximateNumberOfMessagesVisible"
    )


def test_dynamodb_throttling_and_consumed_capacity_per_table_and_index(env):
    body = _body(env)
    indexes = {
        "connections_table": [schema.OWNER_INDEX],
        "sessions_table": [schema.RING_INDEX],
        "messages_table": [schema.MARKERS_INDEX],
    }
    for table, its_indexes in indexes.items():
        name = getattr(env.service, table).table_name
        on_table = {"TableName": _ref(env, name)}
        for metric in (
            "ConsumedReadCapacityUnits",
            "ConsumedWriteCapacityUnits",
            "ReadThrottleEvents",
            "WriteThrottleEvents",
        ):
            drawn = body.metrics("AWS/DynamoDB", metric)
            assert on_table in drawn, f"{metric} of {table}"
            for index in its_indexes:
                assert {**on_table, "GlobalSecondaryIndexName": index} in drawn, f"{metric} of {table}/{index}"
        # ThrottledRequests is per operation: a search over the table's operations.
        placeholders = body.placeholders_of(env.service.resolve(name))
        throttled = [
            e
            for e in body.expressions()
            if 'MetricName="ThrottledRequests"' in e
            and any(re.search(rf'TableName="{re.escape(p)}"', e) for p in placeholders)
        ]
        assert len(throttled) == 1, f"ThrottledRequests of {table}"


def test_every_alarm_is_on_the_alarm_status_widget(env):
    (status,) = [w for w in _body(env).widgets() if w["type"] == "alarm"]
    drawn = {_body(env).resolved(arn) for arn in status["properties"]["alarms"]}
    alarms = env.service_template.find_resources("AWS::CloudWatch::Alarm")
    assert drawn == {json.dumps({"Fn::GetAtt": [logical_id, "Arn"]}, sort_keys=True) for logical_id in alarms}


def _stream_widget(env, metric: str) -> dict:
    (widget,) = [
        w
        for w in _body(env).widgets()
        if any(e[:2] == ["AWS/Kinesis", metric] for e in w["properties"].get("metrics", []))
    ]
    return widget


def test_the_stream_row_draws_the_streams_counts_beside_the_workers(dev):
    body = _body(dev)
    stream = {"StreamName": _ref(dev, dev.service.messages_stream.stream_name)}
    for name in ("IncomingRecords", "WriteProvisionedThroughputExceeded", "PutRecords.Latency"):
        assert body.metrics("AWS/Kinesis", name) and all(d == stream for d in body.metrics("AWS/Kinesis", name))
    # Records the stream took, beside those the workers sent again; the stream's
    # refusals beside the workers' (which count KMS throttling too).
    assert metrics_names.RECORDS_RESENT in _drawn(_stream_widget(dev, "IncomingRecords"))
    assert metrics_names.RECORDS_THROTTLED in _drawn(_stream_widget(dev, "WriteProvisionedThroughputExceeded"))


def test_the_consumer_row_draws_its_lag_against_its_alarm_its_errors_and_its_failure_queue(dev):
    body = _body(dev)
    function = {"FunctionName": _ref(dev, dev.service.consumer.function.function_name)}
    for name in ("IteratorAge", "Invocations", "Errors", "Duration"):
        assert function in body.metrics("AWS/Lambda", name), name
    (lag,) = [
        w
        for w in body.widgets()
        if any(e[:2] == ["AWS/Lambda", "IteratorAge"] for e in w["properties"].get("metrics", []))
    ]
    threshold = dev.settings.consumer.iterator_age_alarm_seconds * 1000
    assert [a["value"] for a in lag["properties"]["annotations"]["horizontal"]] == [threshold]
    queue = {"QueueName": _ref(dev, dev.service.consumer.failure_queue.queue_name)}
    assert queue in body.metrics("AWS/SQS", "ApproximateNumberOfMessagesVisible")


def test_no_stream_or_consumer_graphs_where_there_is_neither(prod):
    body = _body(prod)
    assert not [e for e in body.entries() if e[0] == "AWS/Kinesis"]
    assert not body.metrics("AWS/Lambda", "IteratorAge")


def test_every_metric_the_consumer_publishes_is_graphed_where_it_runs(dev, prod):
    consumer = {metrics_names.DIMENSION_SERVICE_NAME: dev.settings.consumer_service_name}
    for name in metrics_names.CONSUMER_METRICS:
        assert _body(dev).metrics(NAMESPACE, name) == [consumer], name
        assert not _body(prod).metrics(NAMESPACE, name), name
