"""The alarms an operator of the fleet needs, each one a question with a yes/no answer:

* Are START hints failing? (dead-letter queue not empty)
* Is the router failing? (Lambda errors: crashes and timeouts; the 500s it answers
  itself show up as API 5xx)
* Are callers getting 5xx from the API?
* Is the fleet out of room? (the service has sat at its maximum task count)
* Is a STARTED connection without an owner for longer than a failover should take?
* Did the reachability sweep find a connection that no worker would ever take?
* Did a worker loop meet an error it was not built for? (``LoopErrors``: each one is a
  ``loop_error`` log line with its traceback; the loop went on)
* Did the crash-loop breaker quarantine a connection? (``QuarantinedConnections``: it
  was the prime suspect of consecutive deaths of its owners, and waits for a START or
  ``wsfleet retry``; GET shows ``quarantined`` with the reason)
* Does a worker's event loop keep stalling? (``EventLoopLagMs``, the longest the loop
  was held in each interval, at a second or more for minutes: every socket of that
  worker waits as long)
* Have an upstream's credentials stopped working? (connections whose connects keep being
  refused, ``RefusedConnections``: GET shows each one's ``last_error``)

Where kinesis is a sink:

* Is the stream refusing writes for throughput? (its ``WriteProvisionedThroughputExceeded``;
  and the workers' ``RecordsThrottled``, which counts KMS throttling too)

Where firehose is a sink:

* Is the delivery stream failing to put frames in S3? (``DeliveryToS3.Success`` below 1:
  Firehose retries a failed delivery, then writes the batch under ``errors/``)
* Is it refusing records for throughput? (its ``ThrottledRecords``: the workers send them
  again after a backoff)

Where the reference consumer is deployed:

* Is it falling behind? (Lambda's ``IteratorAge`` over a threshold well inside the
  stream's retention: past the retention, records leave the stream undelivered)
* Is it failing? (Lambda errors: a batch that raised or timed out, retried)
* Did it give up on a batch? (the failure queue is not empty: the batch's records were
  not delivered, and its message says which shard and sequence numbers to replay)
* Did it give up on seqs? (its ``SeqsAbandoned``: holes past the few it keeps track of,
  whose seqs, should they arrive later, go downstream as already delivered: lost to users)

No alarm on ``SkippedFrames`` (skip markers stored: seqs whose data users will not get),
though it is graphed: one count mixes reasons nobody here can act on (an upstream's
malformed frames; the gaps of an upstream that cannot replay, ``resume: none``, which
appear at every reconnect by design) with the one an operator can (``over_frame_limit``:
raise ``max_frame_bytes``), so no threshold would tell them apart. A per-reason count
would make an alarm on ``over_frame_limit`` at 1 worth having.
"""

from __future__ import annotations

import math

from aws_cdk import Duration
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from wsfleet import metrics_names

from .consumer import ReferenceConsumer
from .worker_metrics import worker_metric

_GE = cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD
# Minutes with a refused connection, out of a window one minute longer, before the
# credentials alarm fires: a refusal retried (about every minute) five times over. The
# spare minute is for the one-minute period that gets no datapoint: a worker publishes
# every METRICS_SECONDS plus the time publishing takes, so its datapoints drift across
# period boundaries, and a missing datapoint counts as not breaching.
REFUSED_MINUTES = 5
# A worker's event loop held this long (ms) delays every socket of the worker by as much,
# a gap its neighbours' users see; held near the heartbeat, the session misses a renewal.
# One such minute can be a GC pause or a burst; STALLED_MINUTES of STALLED_MINUTES + 2 is
# a worker that keeps stalling (a hostile upstream's frames, a blocking call).
STALLED_LOOP_MS = 1000
STALLED_MINUTES = 3
# A feed mostly malformed this many minutes running (its gauge already looks back 5 minutes).
MALFORMED_MINUTES = 5


class Alarms(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        prefix: str,
        dead_letter_queue: sqs.IQueue,
        router: lambda_.IFunction,
        api: apigw.RestApi,
        service: ecs.FargateService,
        max_workers: int,
        metrics_namespace: str,
        service_name: str,
        failover_bound: Duration,
        alarm_topic_arn: str | None,
        stream: kinesis.IStream | None = None,
        consumer: ReferenceConsumer | None = None,
        consumer_service_name: str = metrics_names.CONSUMER_SERVICE_NAME,
        delivery_stream_name: str | None = None,
    ) -> None:
        """``stream`` where kinesis is a sink; ``consumer`` where the reference consumer is;
        ``delivery_stream_name`` where firehose is a sink."""
        super().__init__(scope, id)
        one_minute = Duration.minutes(1)
        five_minutes = Duration.minutes(5)

        def service_metric(name: str, period: Duration, statistic: str) -> cloudwatch.Metric:
            return worker_metric(metrics_namespace, service_name, name, period=period, statistic=statistic)

        self.dead_letters = self._any_in_period(
            "DeadLetters",
            alarm_name=f"{prefix}-start-hints-dead-lettered",
            alarm_description="START hints reached the dead-letter queue: inspect and redrive them.",
            metric=dead_letter_queue.metric_approximate_number_of_messages_visible(
                period=one_minute, statistic=cloudwatch.Stats.MAXIMUM
            ),
        )
        self.router_errors = self._any_in_period(
            "RouterErrors",
            alarm_name=f"{prefix}-router-errors",
            alarm_description="The event router crashed or timed out (a bad request never counts).",
            metric=router.metric_errors(period=five_minutes, statistic=cloudwatch.Stats.SUM),
        )
        self.api_server_errors = self._any_in_period(
            "Api5xx",
            alarm_name=f"{prefix}-api-5xx",
            alarm_description="The events API answered 5xx.",
            metric=api.metric_server_error(period=five_minutes, statistic=cloudwatch.Stats.SUM),
        )
        # Container Insights' desired count: at the maximum for 15 minutes means the
        # target tracking wants more tasks than it may start.
        self.at_max_capacity = cloudwatch.Alarm(
            self,
            "AtMaxCapacity",
            alarm_name=f"{prefix}-workers-at-max-capacity",
            alarm_description="The worker service has stayed at its maximum task count: raise max_workers.",
            metric=cloudwatch.Metric(
                namespace="ECS/ContainerInsights",
                metric_name="DesiredTaskCount",
                dimensions_map={"ClusterName": service.cluster.cluster_name, "ServiceName": service.service_name},
                period=five_minutes,
                statistic=cloudwatch.Stats.MINIMUM,
            ),
            threshold=max_workers,
            comparison_operator=_GE,
            evaluation_periods=3,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        # One worker (the fleet's summarizer, which reads every session) counts the STARTED
        # connections nobody owns from the by_owner index: those in the FREE#<shard>
        # partitions at two of its samples in a row (every START and handoff passes
        # through them for a moment, so a busy fleet always has a few there), plus the
        # connections of every session in the ring that is ENDED or past expiry. The
        # others publish no count; the Maximum over workers is that one's. A crashed
        # worker's connections are owned again within the failover bound (lease + skew
        # margin + watch window + 2 x reconcile, see EnvironmentSettings). An episode of
        # d seconds can show in ceil(d / 60) + 1 consecutive one-minute periods (it may
        # straddle a boundary), so the alarm wants one period more than that for the
        # bound: a failover that ends in time never fires it. A missing metric means no
        # worker is running, so every STARTED connection is unowned: that breaches too.
        periods = math.ceil(failover_bound.to_seconds() / one_minute.to_seconds()) + 2
        self.unowned_connections = cloudwatch.Alarm(
            self,
            "UnownedConnections",
            alarm_name=f"{prefix}-connections-unowned",
            alarm_description=(
                f"STARTED connections have had no owner for longer than the failover bound "
                f"({failover_bound.to_seconds():.0f} s)."
            ),
            metric=service_metric(metrics_names.UNOWNED_CONNECTIONS, one_minute, cloudwatch.Stats.MAXIMUM),
            threshold=1,
            comparison_operator=_GE,
            evaluation_periods=periods,
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
        )

        # The fleet's reachability sweep (one worker, the summarizer) counts every
        # connection it finds that no worker would ever take, and repairs it. The
        # invariant is kept by construction, so any count at all is a bug to look into.
        self.unreachable_connections = self._any_in_period(
            "UnreachableConnections",
            alarm_name=f"{prefix}-connections-unreachable",
            alarm_description=(
                "The reachability sweep found connections that no worker would ever take (and repaired them): "
                "look for its unreachable_connection log lines."
            ),
            metric=service_metric(metrics_names.UNREACHABLE_CONNECTIONS, five_minutes, cloudwatch.Stats.SUM),
        )

        # Transient faults (throttling, timeouts, 5xx) are not counted: one error is news.
        self.loop_errors = self._any_in_period(
            "LoopErrors",
            alarm_name=f"{prefix}-worker-loop-errors",
            alarm_description=(
                "A worker loop met an error that was neither transient nor handled where it arose "
                "(AccessDenied, a missing table, a bug): search the worker logs for loop_error, which "
                "carries the traceback. The loop went on, retrying with backoff."
            ),
            metric=service_metric(metrics_names.LOOP_ERRORS, five_minutes, cloudwatch.Stats.SUM),
        )

        # Counted once per quarantine, by the worker whose strike set it: one is news.
        self.quarantined_connections = self._any_in_period(
            "QuarantinedConnections",
            alarm_name=f"{prefix}-connections-quarantined",
            alarm_description=(
                "The crash-loop breaker quarantined a connection: it was the prime suspect of consecutive deaths of "
                "its workers. Search the worker logs for connection_struck (its connection_id and why); GET "
                "/connections/<id> shows quarantined. Fix the upstream or the limits, then wsfleet retry <id>."
            ),
            metric=service_metric(metrics_names.QUARANTINED_CONNECTIONS, five_minutes, cloudwatch.Stats.SUM),
        )

        # Each worker publishes how many of its connections had their last connect refused
        # (after the re-fetch of their secrets, for a 401/403); such a connection retries
        # about once a minute. One refusal that the next retry gets past (a rotation that
        # had not reached the upstream yet) shows for a minute or two; a refusal in
        # REFUSED_MINUTES minutes of a window is credentials that stopped working (or a
        # wrong ARN, an upstream that turned the key away). The Maximum over workers:
        # any worker with any such connection. No worker reporting is the unowned alarm's.
        self.refused_connections = cloudwatch.Alarm(
            self,
            "RefusedConnections",
            alarm_name=f"{prefix}-upstream-refused",
            alarm_description=(
                f"Upstreams have refused connections in {REFUSED_MINUTES} of the last {REFUSED_MINUTES + 1} "
                "minutes (401/403 after the secrets "
                "were fetched again, another 4xx, a secret that cannot be read): GET /connections/<id> shows "
                "each one's last_error; fix the secret or the grant, the worker retries about once a minute."
            ),
            metric=service_metric(metrics_names.REFUSED_CONNECTIONS, one_minute, cloudwatch.Stats.MAXIMUM),
            threshold=1,
            comparison_operator=_GE,
            evaluation_periods=REFUSED_MINUTES + 1,
            datapoints_to_alarm=REFUSED_MINUTES,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

        # The Maximum over workers of each one's longest stall in its interval: any worker.
        self.event_loop_stalled = cloudwatch.Alarm(
            self,
            "EventLoopStalled",
            alarm_name=f"{prefix}-worker-event-loop-stalled",
            alarm_description=(
                f"A worker's event loop was held for {STALLED_LOOP_MS} ms or more in {STALLED_MINUTES} of the last "
                f"{STALLED_MINUTES + 2} minutes: every connection of that worker waited as long. The worker's stats "
                "log lines show loop_lag_max_ms; look at what it was doing then (a huge frame, a blocking call)."
            ),
            metric=service_metric(metrics_names.EVENT_LOOP_LAG, one_minute, cloudwatch.Stats.MAXIMUM),
            threshold=STALLED_LOOP_MS,
            comparison_operator=_GE,
            evaluation_periods=STALLED_MINUTES + 2,
            datapoints_to_alarm=STALLED_MINUTES,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

        # Each worker publishes how many of its connections received mostly malformed frames
        # over the last 5 minutes (worker.feed_health): a feed whose format changed, which
        # would otherwise look like a quiet one. Any worker with any, 5 minutes running.
        self.malformed_feeds = cloudwatch.Alarm(
            self,
            "MalformedFeeds",
            alarm_name=f"{prefix}-feeds-malformed",
            alarm_description=(
                "Connections whose frames have been mostly malformed for 5 minutes (more than half of at least 10 in "
                "the last 5 minutes): did the upstream's format change? The worker logs malformed_frame lines with "
                "the problem and the connection_id; fix the upstream object's format, pointers or ignore rules."
            ),
            metric=service_metric(metrics_names.MALFORMED_CONNECTIONS, one_minute, cloudwatch.Stats.MAXIMUM),
            threshold=1,
            comparison_operator=_GE,
            evaluation_periods=MALFORMED_MINUTES,
            datapoints_to_alarm=MALFORMED_MINUTES,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

        self.all: tuple[cloudwatch.Alarm, ...] = (
            self.dead_letters,
            self.router_errors,
            self.api_server_errors,
            self.at_max_capacity,
            self.unowned_connections,
            self.unreachable_connections,
            self.loop_errors,
            self.quarantined_connections,
            self.refused_connections,
            self.event_loop_stalled,
            self.malformed_feeds,
        )
        self.stream_throttled: cloudwatch.Alarm | None = None
        self.records_throttled: cloudwatch.Alarm | None = None
        if stream is not None:
            # A throttled record is sent again after a backoff: nothing is lost, but frames
            # wait. An on-demand stream throttles while it doubles its capacity for a
            # sudden step up in writes, or when one connection (one partition key, one
            # shard) writes faster than a shard takes.
            self.stream_throttled = self._any_in_period(
                "StreamWriteThrottled",
                alarm_name=f"{prefix}-stream-write-throttled",
                alarm_description=(
                    "The messages stream refused records for throughput (the workers send them again after a "
                    "backoff): a step up in the write rate, or one connection writing faster than a shard "
                    "takes (1 MB/s, 1,000 records/s). See `wsfleet plan` for the stream's limits."
                ),
                metric=stream.metric_write_provisioned_throughput_exceeded(
                    period=five_minutes, statistic=cloudwatch.Stats.SUM
                ),
            )
            self.records_throttled = self._any_in_period(
                "RecordsThrottled",
                alarm_name=f"{prefix}-worker-records-throttled",
                alarm_description=(
                    "Workers had records refused for throughput by the stream or by KMS (a customer-managed "
                    "key's request quota), and sent them again after a backoff."
                ),
                metric=service_metric(metrics_names.RECORDS_THROTTLED, five_minutes, cloudwatch.Stats.SUM),
            )
            self.all += (self.stream_throttled, self.records_throttled)
        self.delivery_failed: cloudwatch.Alarm | None = None
        if delivery_stream_name is not None:

            def delivery_metric(name: str, statistic: str) -> cloudwatch.Metric:
                return cloudwatch.Metric(
                    namespace="AWS/Firehose",
                    metric_name=name,
                    dimensions_map={"DeliveryStreamName": delivery_stream_name},
                    period=five_minutes,
                    statistic=statistic,
                )

            # The share of S3 deliveries that succeeded, per attempt: below 1 is a failed
            # one (the role, the bucket, a partition it could not write). Published only
            # when it delivers, so no data is fine.
            self.delivery_failed = cloudwatch.Alarm(
                self,
                "DeliveryFailed",
                alarm_name=f"{prefix}-delivery-to-s3-failed",
                alarm_description=(
                    "The Firehose delivery stream failed to put frames in S3 (it retries, then writes the "
                    "batch under errors/ in its bucket): see its DestinationDelivery log stream."
                ),
                metric=delivery_metric("DeliveryToS3.Success", cloudwatch.Stats.MINIMUM),
                threshold=1,
                comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
                evaluation_periods=1,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            self.delivery_throttled = self._any_in_period(
                "DeliveryThrottled",
                alarm_name=f"{prefix}-delivery-throttled",
                alarm_description=(
                    "The Firehose delivery stream refused records for throughput (the workers send them again "
                    "after a backoff): raise its quota (records, requests or MiB per second) before frames wait."
                ),
                metric=delivery_metric("ThrottledRecords", cloudwatch.Stats.SUM),
            )
            self.all += (self.delivery_failed, self.delivery_throttled)
        self.consumer_iterator_age: cloudwatch.Alarm | None = None
        if consumer is not None:
            function, iterator_age_threshold = consumer.function, consumer.iterator_age_alarm_threshold
            # The age of the last record of each batch when it was read: how far the
            # consumer is behind the stream's newest record. Lambda publishes it per
            # invocation, so no data means no records to read.
            self.consumer_iterator_age = cloudwatch.Alarm(
                self,
                "ConsumerIteratorAge",
                alarm_name=f"{prefix}-consumer-iterator-age",
                alarm_description=(
                    f"The reference consumer is more than {iterator_age_threshold.to_seconds():.0f} s behind the "
                    "stream: a failing batch it keeps retrying (see its errors and logs), or more records than "
                    "it keeps up with. Records it has not read when they leave the stream are lost to it."
                ),
                metric=function.metric("IteratorAge", period=five_minutes, statistic=cloudwatch.Stats.MAXIMUM),
                threshold=iterator_age_threshold.to_milliseconds(),
                comparison_operator=_GE,
                evaluation_periods=1,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            self.consumer_errors = self._any_in_period(
                "ConsumerErrors",
                alarm_name=f"{prefix}-consumer-errors",
                alarm_description=(
                    "The reference consumer raised or timed out on a batch (Lambda retries it): "
                    "search its logs for the error."
                ),
                metric=function.metric_errors(period=five_minutes, statistic=cloudwatch.Stats.SUM),
            )
            self.consumer_gave_up = self._any_in_period(
                "ConsumerGaveUp",
                alarm_name=f"{prefix}-consumer-batches-abandoned",
                alarm_description=(
                    "The reference consumer gave up on a batch after its retries: those records were not "
                    "delivered. Each message in its failure queue names the shard and sequence numbers to "
                    "replay while the stream still keeps them."
                ),
                metric=consumer.failure_queue.metric_approximate_number_of_messages_visible(
                    period=one_minute, statistic=cloudwatch.Stats.MAXIMUM
                ),
            )
            self.consumer_seqs_abandoned = self._any_in_period(
                "ConsumerSeqsAbandoned",
                alarm_name=f"{prefix}-consumer-seqs-abandoned",
                alarm_description=(
                    "The reference consumer stopped waiting for seqs missing below delivered ones (more holes "
                    "in one connection than it keeps track of): should they arrive, they are dropped as "
                    "delivered. Its log lines gap_abandoned name the connection and the seqs."
                ),
                metric=cloudwatch.Metric(
                    namespace=metrics_namespace,
                    metric_name=metrics_names.SEQS_ABANDONED,
                    dimensions_map={metrics_names.DIMENSION_SERVICE_NAME: consumer_service_name},
                    period=five_minutes,
                    statistic=cloudwatch.Stats.SUM,
                ),
            )
            self.all += (
                self.consumer_iterator_age,
                self.consumer_errors,
                self.consumer_gave_up,
                self.consumer_seqs_abandoned,
            )
        if alarm_topic_arn is not None:
            topic = sns.Topic.from_topic_arn(self, "Topic", alarm_topic_arn)
            for alarm in self.all:
                alarm.add_alarm_action(cloudwatch_actions.SnsAction(topic))

    def _any_in_period(self, id: str, *, metric: cloudwatch.IMetric, **props: str) -> cloudwatch.Alarm:
        """An alarm on any occurrence: one datapoint at 1 or more; no data is fine."""
        return cloudwatch.Alarm(
            self,
            id,
            metric=metric,
            threshold=1,
            comparison_operator=_GE,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            **props,
        )
