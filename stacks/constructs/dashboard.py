"""The fleet's CloudWatch dashboard: one page an operator reads top to bottom.

1. the alarms' states;
2. connections: per worker, in total, unowned (against its alarm) and unreachable (what
   the reachability sweep found and repaired, against its alarm);
3. what the workers do: leases acquired, lost and released, orphans recovered,
   messages stored (and how many of them as S3 objects), reconnects, malformed frames,
   skip markers stored, backpressure waits, loop errors and frames dropped;
   upstreams: connections refused (against their alarm), refusals, secret fetches and
   seqs missed; event-loop lag;
4. the API (requests, 4xx, 5xx, latency) and the router (errors, throttles, duration);
5. the START-hint queue (oldest hint's age) and its dead-letter queue (depth);
6. DynamoDB per table (and per index): throttling, consumed read and write capacity;
7. where kinesis is a sink, the messages stream: records put, sent again and refused for
   throughput, PutRecords latency; where the reference consumer is deployed, how far
   behind it is (against its alarm), its invocations, errors and duration, the
   batches it gave up on, and its own counts: frames delivered, duplicates and stale
   records dropped, records that were not wsfleet's, deliveries that failed.

The worker's metrics are named by ``wsfleet.metrics_names``, the constants it publishes
with. Every graph is per minute, the interval at which the workers publish, but the
unreachable one, per 5 minutes like its alarm (the sweep's counts are rare). The
dashboard itself costs $3 a month beyond an account's first three.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from aws_cdk import Duration, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from wsfleet import metrics_names as names
from wsfleet.metrics import EMF_EVENT

from .consumer import ReferenceConsumer
from .worker_metrics import worker_metric

PERIOD = Duration.minutes(1)
_SUM = cloudwatch.Stats.SUM
_MAX = cloudwatch.Stats.MAXIMUM
_AVG = cloudwatch.Stats.AVERAGE
_P50 = cloudwatch.Stats.percentile(50)
_P99 = cloudwatch.Stats.percentile(99)


class OperationsDashboard(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        dashboard_name: str,
        metrics_namespace: str,
        service_name: str,
        target_connections_per_worker: int,
        consumer_service_name: str = names.CONSUMER_SERVICE_NAME,
        max_connections_per_worker: int,
        alarms: Sequence[cloudwatch.Alarm],
        unowned_alarm: cloudwatch.Alarm,
        unreachable_alarm: cloudwatch.Alarm,
        refused_alarm: cloudwatch.Alarm,
        api: apigw.RestApi,
        router: lambda_.IFunction,
        start_queue: sqs.IQueue,
        dead_letter_queue: sqs.IQueue,
        tables: Mapping[str, dynamodb.ITable],
        indexes: Mapping[str, Sequence[str]],
        stream: kinesis.IStream | None = None,
        consumer: ReferenceConsumer | None = None,
        iterator_age_alarm: cloudwatch.Alarm | None = None,
        worker_log_group: logs.ILogGroup,
    ) -> None:
        """``tables`` by the name the graphs give them ("connections"); ``indexes``:
        the global secondary indexes of those tables, whose capacity is their own.
        ``stream`` where kinesis is a sink; ``consumer`` and its iterator-age alarm where
        the reference consumer is deployed."""
        super().__init__(scope, id)
        self._namespace = metrics_namespace
        self._worker_log_group = worker_log_group
        self._service_name = service_name
        self._consumer_service_name = consumer_service_name
        self.dashboard = cloudwatch.Dashboard(
            self, "Dashboard", dashboard_name=dashboard_name, default_interval=Duration.hours(3)
        )
        region = Stack.of(self).region
        self.url = (
            f"https://{region}.console.aws.amazon.com/cloudwatch/home"
            f"?region={region}#dashboards:name={self.dashboard.dashboard_name}"
        )

        self.dashboard.add_widgets(
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(alarms), width=24, height=3)
        )
        self.dashboard.add_widgets(
            *self._connections(target_connections_per_worker, max_connections_per_worker, unowned_alarm)
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Unreachable connections found and repaired by the sweep (per 5 minutes)",
                left=[self._worker_metric(names.UNREACHABLE_CONNECTIONS, _SUM, "unreachable", Duration.minutes(5))],
                left_annotations=[unreachable_alarm.to_annotation()],
                width=24,
            )
        )
        self.dashboard.add_widgets(
            self._graph(
                "Leases (per minute)",
                [
                    self._worker_metric(names.LEASES_ACQUIRED, _SUM, "acquired"),
                    self._worker_metric(names.LEASES_RELEASED, _SUM, "released"),
                    self._worker_metric(names.LEASES_LOST, _SUM, "lost"),
                    self._worker_metric(names.ORPHANS_RECOVERED, _SUM, "orphans recovered"),
                    self._worker_metric(names.HANDOFFS_UNCLAIMED, _SUM, "handoffs unclaimed (freed)"),
                ],
                width=6,
            ),
            self._graph(
                "Messages stored (per minute)",
                [
                    self._worker_metric(names.MESSAGES_STORED, _SUM, "stored"),
                    self._worker_metric(names.LARGE_FRAMES, _SUM, "of which large (S3 objects)"),
                ],
                width=6,
            ),
            # Skip markers are seqs whose data users will not get; no alarm on them: the
            # metric mixes the reasons (see stacks/constructs/alarms.py).
            self._graph(
                "Upstream trouble (per minute)",
                [
                    self._worker_metric(names.RECONNECTS, _SUM, "reconnects"),
                    self._worker_metric(names.MALFORMED_FRAMES, _SUM, "malformed frames"),
                    self._worker_metric(names.SKIPPED_FRAMES, _SUM, "skip markers stored"),
                    self._worker_metric(names.BACKPRESSURE_WAITS, _SUM, "backpressure waits"),
                ],
                width=6,
            ),
            # All should stay at zero: each loop error has a loop_error log line with its
            # traceback (and an alarm); a dropped frame, a frame_dropped line; failed span
            # exports (TRACING=otel: the collector sidecar down or refusing), a
            # trace_export_failed line per burst. Traces lost cost no data: no alarm. A
            # quarantine (the crash-loop breaker's, alarmed) has a connection_struck line.
            self._graph(
                "Worker errors (per minute)",
                [
                    self._worker_metric(names.LOOP_ERRORS, _SUM, "loop errors"),
                    self._worker_metric(names.FRAMES_DROPPED, _SUM, "frames dropped"),
                    self._worker_metric(names.TRACE_EXPORT_FAILURES, _SUM, "trace exports failed"),
                    self._worker_metric(names.QUARANTINED_CONNECTIONS, _SUM, "connections quarantined"),
                ],
                width=6,
            ),
        )
        self.dashboard.add_widgets(*self._upstreams(refused_alarm))
        self.dashboard.add_widgets(
            self._graph(
                "Event-loop lag of each worker (ms)",
                [
                    self._worker_metric(names.LOOP_LAG_P99, _MAX, "p99, worst worker"),
                    self._worker_metric(names.LOOP_LAG_P99, _AVG, "p99, average worker"),
                    self._worker_metric(names.EVENT_LOOP_LAG, _MAX, "longest stall, worst worker"),
                ],
            ),
            self._graph(
                "API requests and errors (per minute)",
                [
                    api.metric_count(period=PERIOD, statistic=_SUM, label="requests"),
                    api.metric_client_error(period=PERIOD, statistic=_SUM, label="4xx"),
                    api.metric_server_error(period=PERIOD, statistic=_SUM, label="5xx"),
                ],
            ),
            self._graph(
                "API latency (ms)",
                [
                    api.metric_latency(period=PERIOD, statistic=_P50, label="p50"),
                    api.metric_latency(period=PERIOD, statistic=_P99, label="p99"),
                ],
            ),
        )
        self.dashboard.add_widgets(
            self._graph(
                "Router errors (per minute)",
                [
                    router.metric_errors(period=PERIOD, statistic=_SUM, label="errors"),
                    router.metric_throttles(period=PERIOD, statistic=_SUM, label="throttles"),
                ],
                width=6,
            ),
            self._graph(
                "Router duration (ms)",
                [
                    router.metric_duration(period=PERIOD, statistic=_P50, label="p50"),
                    router.metric_duration(period=PERIOD, statistic=_P99, label="p99"),
                    router.metric_duration(period=PERIOD, statistic=_MAX, label="max"),
                ],
                width=6,
            ),
            self._graph(
                "START hints: oldest message age (s)",
                [start_queue.metric_approximate_age_of_oldest_message(period=PERIOD, statistic=_MAX, label="oldest")],
                width=6,
            ),
            self._graph(
                "Dead-lettered START hints",
                [
                    dead_letter_queue.metric_approximate_number_of_messages_visible(
                        period=PERIOD, statistic=_MAX, label="visible"
                    )
                ],
                width=6,
            ),
        )
        self.dashboard.add_widgets(*self._dynamodb(tables, indexes))
        if stream is not None:
            self.dashboard.add_widgets(*self._stream(stream))
        if consumer is not None:
            assert iterator_age_alarm is not None
            self.dashboard.add_widgets(*self._consumer(consumer.function, consumer.failure_queue, iterator_age_alarm))
            self.dashboard.add_widgets(self._consumer_records())

    def _connections(self, target: int, maximum: int, unowned_alarm: cloudwatch.Alarm) -> list[cloudwatch.IWidget]:
        # Per worker: the workers publish their metrics as EMF log lines whose only
        # dimension is ServiceName (the number of metrics does not grow with the tasks);
        # each line names its worker (WorkerId, the ECS task id) as a property, so the
        # per-worker view is a Logs Insights query over the worker's log group.
        per_worker = cloudwatch.LogQueryWidget(
            title="Active connections per worker (latest report, and its peak in the window)",
            log_group_names=[self._worker_log_group.log_group_name],
            query_lines=[
                f"fields {names.DIMENSION_WORKER_ID}, {names.ACTIVE_CONNECTIONS}",
                f'filter event = "{EMF_EVENT}"',
                f"stats latest({names.ACTIVE_CONNECTIONS}) as active, max({names.ACTIVE_CONNECTIONS}) as peak "
                f"by {names.DIMENSION_WORKER_ID}",
                "sort active desc",
                "limit 100",
            ],
            view=cloudwatch.LogQueryVisualizationType.TABLE,
            width=8,
        )
        # Each worker reports once a metrics interval: the sum over one is the fleet's total.
        total = self._worker_metric(names.ACTIVE_CONNECTIONS, _SUM, "total (the workers' reports summed)")
        return [
            per_worker,
            cloudwatch.GraphWidget(
                title="Active connections: average per worker (left, what scaling tracks), total (right)",
                left=[self._worker_metric(names.ACTIVE_CONNECTIONS, _AVG, "average per worker")],
                left_annotations=[
                    cloudwatch.HorizontalAnnotation(value=target, label="scaling target"),
                    cloudwatch.HorizontalAnnotation(value=maximum, label="max per worker"),
                ],
                right=[total],
                width=8,
            ),
            # The alarm's own metric (one worker counts for the fleet) with its threshold drawn.
            cloudwatch.GraphWidget(
                title="Unowned connections (counted by the fleet's summarizer)",
                left=[self._worker_metric(names.UNOWNED_CONNECTIONS, _MAX, "unowned")],
                left_annotations=[unowned_alarm.to_annotation()],
                width=8,
            ),
        ]

    def _upstreams(self, refused_alarm: cloudwatch.Alarm) -> list[cloudwatch.IWidget]:
        # Refusals, and the fetches of the secrets they are about (each GetSecretValue is
        # priced by `wsfleet plan`: a fetch per secret per worker per cache period, plus one
        # after each 401/403), beside the sockets closed over a budget, which wait as
        # refusals do; MissedSeqs counts every seq an upstream went past (resume none),
        # where SkippedFrames counts the markers.
        return [
            cloudwatch.GraphWidget(
                title="Connections refused by their upstream (most on one worker)",
                left=[self._worker_metric(names.REFUSED_CONNECTIONS, _MAX, "refused connections")],
                left_annotations=[refused_alarm.to_annotation()],
                width=8,
            ),
            self._graph(
                "Upstream refusals and secret fetches (per minute)",
                [
                    self._worker_metric(names.UPSTREAM_REFUSALS, _SUM, "refusals"),
                    self._worker_metric(names.BUDGET_CLOSES, _SUM, "closes over budget"),
                    self._worker_metric(names.SECRET_FETCHES, _SUM, "GetSecretValue calls"),
                ],
            ),
            self._graph(
                "Seqs missed by upstreams that cannot replay (per minute)",
                [self._worker_metric(names.MISSED_SEQS, _SUM, "missed seqs")],
            ),
            # Feeds: silent ones (reconnected after max_silence_seconds, or silent across
            # reconnects), heartbeats and acks dropped by ignore rules, feeds gone malformed.
            self._graph(
                "Feeds: silent, mostly malformed (most on one worker), reconnects for silence and frames ignored",
                [
                    self._worker_metric(names.SILENT_CONNECTIONS, _MAX, "silent connections"),
                    self._worker_metric(names.MALFORMED_CONNECTIONS, _MAX, "mostly malformed connections"),
                    self._worker_metric(names.SILENCE_RECONNECTS, _SUM, "reconnects for silence"),
                    self._worker_metric(names.IGNORED_FRAMES, _SUM, "frames ignored"),
                ],
                width=24,
            ),
        ]

    def _dynamodb(
        self, tables: Mapping[str, dynamodb.ITable], indexes: Mapping[str, Sequence[str]]
    ) -> list[cloudwatch.IWidget]:
        throttles: list[cloudwatch.IMetric] = []
        reads: list[cloudwatch.IMetric] = []
        writes: list[cloudwatch.IMetric] = []
        for name, table in tables.items():
            # ThrottledRequests has an Operation dimension: the search sums whatever
            # operations were made. A batch counts there only when all of it was
            # throttled, so the throttle events (each throttled read or write, batches
            # included; an index's are its own) are drawn too.
            throttled = (
                "SEARCH('{AWS/DynamoDB,Operation,TableName} MetricName=\"ThrottledRequests\" "
                f"TableName=\"{table.table_name}\"', 'Sum', {int(PERIOD.to_seconds())})"
            )
            throttles.append(
                cloudwatch.MathExpression(
                    expression=f"SUM({throttled})", using_metrics={}, label=f"{name}: requests", period=PERIOD
                )
            )
            for index in (None, *indexes.get(name, ())):
                label = name if index is None else f"{name}/{index}"
                dims = {"TableName": table.table_name}
                if index is not None:
                    dims["GlobalSecondaryIndexName"] = index
                # Metric ids must be unique in a graph and may not contain "/".
                r, w = (f"{kind}_{label.replace('/', '_')}" for kind in ("r", "w"))
                throttles.append(
                    cloudwatch.MathExpression(
                        expression=f"{r} + {w}",
                        using_metrics={
                            r: _dynamodb_metric("ReadThrottleEvents", dims),
                            w: _dynamodb_metric("WriteThrottleEvents", dims),
                        },
                        label=f"{label}: events",
                        period=PERIOD,
                    )
                )
                reads.append(_dynamodb_metric("ConsumedReadCapacityUnits", dims, label))
                writes.append(_dynamodb_metric("ConsumedWriteCapacityUnits", dims, label))
        return [
            self._graph("DynamoDB throttling (per minute)", throttles),
            self._graph("DynamoDB consumed read capacity (units per minute)", reads),
            self._graph("DynamoDB consumed write capacity (units per minute)", writes),
        ]

    def _stream(self, stream: kinesis.IStream) -> list[cloudwatch.IWidget]:
        # The stream's own counts beside the workers': records the stream took, and the
        # records each worker sent again (the refused ones, and the later ones of their
        # connection that went in the same request) or had refused for throughput.
        return [
            self._graph(
                "Messages stream: records (per minute)",
                [
                    stream.metric_incoming_records(period=PERIOD, statistic=_SUM, label="records put (stream)"),
                    self._worker_metric(names.RECORDS_RESENT, _SUM, "sent again after a partial failure"),
                ],
            ),
            self._graph(
                "Messages stream: refused for throughput (per minute)",
                [
                    stream.metric_write_provisioned_throughput_exceeded(
                        period=PERIOD, statistic=_SUM, label="refused (stream)"
                    ),
                    self._worker_metric(names.RECORDS_THROTTLED, _SUM, "refused, stream or KMS (workers)"),
                ],
            ),
            self._graph(
                "Messages stream: PutRecords latency (ms)",
                [
                    stream.metric_put_records_latency(period=PERIOD, statistic=_P50, label="p50"),
                    stream.metric_put_records_latency(period=PERIOD, statistic=_P99, label="p99"),
                ],
            ),
        ]

    def _consumer(
        self, consumer: lambda_.IFunction, failure_queue: sqs.IQueue, iterator_age_alarm: cloudwatch.Alarm
    ) -> list[cloudwatch.IWidget]:
        return [
            cloudwatch.GraphWidget(
                title="Reference consumer: iterator age (ms)",
                left=[consumer.metric("IteratorAge", period=PERIOD, statistic=_MAX, label="behind the stream")],
                left_annotations=[iterator_age_alarm.to_annotation()],
                width=6,
            ),
            self._graph(
                "Reference consumer: invocations and errors (per minute)",
                [
                    consumer.metric_invocations(period=PERIOD, statistic=_SUM, label="invocations"),
                    consumer.metric_errors(period=PERIOD, statistic=_SUM, label="errors"),
                    consumer.metric_throttles(period=PERIOD, statistic=_SUM, label="throttles"),
                ],
                width=6,
            ),
            self._graph(
                "Reference consumer: duration (ms)",
                [
                    consumer.metric_duration(period=PERIOD, statistic=_P50, label="p50"),
                    consumer.metric_duration(period=PERIOD, statistic=_MAX, label="max"),
                ],
                width=6,
            ),
            self._graph(
                "Reference consumer: batches given up on",
                [
                    failure_queue.metric_approximate_number_of_messages_visible(
                        period=PERIOD, statistic=_MAX, label="in the failure queue"
                    )
                ],
                width=6,
            ),
        ]

    def _consumer_records(self) -> cloudwatch.IWidget:
        # The consumer's own counts (embedded metrics in its log lines, dimension
        # ServiceName wsfleet-<env>-consumer): what it delivered,
        # and what it dropped and why. Duplicates are a takeover's replay or a resend.
        labels = {
            names.FRAMES_DELIVERED: "delivered",
            names.DUPLICATES_DROPPED: "duplicates dropped",
            names.STALE_RECORDS_DROPPED: "stale owner's records dropped",
            names.BAD_RECORDS: "not wsfleet records (skipped)",
            names.DELIVERIES_FAILED: "connections whose delivery failed (retried)",
            names.SEQS_ABANDONED: "seqs given up as never to arrive (lost)",
        }
        return cloudwatch.GraphWidget(
            title="Reference consumer: records (per minute)",
            left=[
                cloudwatch.Metric(
                    namespace=self._namespace,
                    metric_name=name,
                    dimensions_map={names.DIMENSION_SERVICE_NAME: self._consumer_service_name},
                    period=PERIOD,
                    statistic=_SUM,
                    label=label,
                )
                for name, label in labels.items()
            ],
            width=24,
        )

    def _worker_metric(
        self, metric_name: str, statistic: str, label: str, period: Duration = PERIOD
    ) -> cloudwatch.Metric:
        return worker_metric(self._namespace, self._service_name, metric_name, period=period, statistic=statistic, label=label)

    @staticmethod
    def _graph(title: str, left: Sequence[cloudwatch.IMetric], *, width: int = 8) -> cloudwatch.GraphWidget:
        return cloudwatch.GraphWidget(title=title, left=list(left), width=width)


def _dynamodb_metric(metric_name: str, dimensions: Mapping[str, str], label: str | None = None) -> cloudwatch.Metric:
    """A DynamoDB metric of one table or index, summed per minute."""
    return cloudwatch.Metric(
        namespace="AWS/DynamoDB",
        metric_name=metric_name,
        dimensions_map=dict(dimensions),
        period=PERIOD,
        statistic=_SUM,
        label=label,
    )
