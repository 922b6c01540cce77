"""The parts of an environment's settings (``stacks.settings.EnvironmentSettings``): the
reference consumer's, tracing's and a table's warm throughput, each checked as it is
built, and the error every setting's check raises.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

from aws_cdk import aws_logs as logs

from wsfleet import config, settings_spec, tracing
from wsfleet.plan import environments as plan_environments
from wsfleet.plan import limits as plan_limits
from wsfleet.settings_spec import ConfigError


class SettingsError(ValueError):
    """An environment's settings are inconsistent; the message names the setting."""


# What a setting of each simple annotated type must hold ("X | None": that or None): a
# bool is no number here, a float no whole number, and inf or nan no number of seconds.
_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "int": (lambda value: type(value) is int, "a whole number"),
    "float": (lambda value: type(value) in (int, float) and math.isfinite(value), "a finite number"),
    "bool": (lambda value: type(value) is bool, "True or False"),
    "str": (lambda value: isinstance(value, str), "a string"),
    "tuple[str, ...]": (
        lambda value: isinstance(value, tuple) and all(isinstance(item, str) for item in value),
        "a tuple of strings",
    ),
    "ConsumerSettings": (lambda value: isinstance(value, ConsumerSettings), "a ConsumerSettings(...)"),
    "MessagesCapacity": (lambda value: isinstance(value, MessagesCapacity), "a MessagesCapacity(...)"),
    # A number of days is no RetentionDays: CDK's own type check stops the synth with a
    # TypeError traceback from deep inside a LogGroup.
    "logs.RetentionDays": (lambda value: isinstance(value, logs.RetentionDays), "a logs.RetentionDays member"),
}


def check_types(settings: Any, prefix: str = "") -> None:
    """Every setting of a type in ``_TYPES`` holds one, checked before anything compares
    them: a string, a float, a bool or None in ``max_workers`` (say) stops the synth with a
    sentence naming it instead of a TypeError further on, or a template CloudFormation
    refuses. ``prefix`` names the settings' owner (``consumer.``)."""
    for setting in dataclasses.fields(settings):
        value = getattr(settings, setting.name)
        kind = str(setting.type).removesuffix(" | None")
        optional = kind != setting.type
        if kind not in _TYPES or (optional and value is None):
            continue
        accepts, what = _TYPES[kind]
        if not accepts(value):
            also = " or None" if optional else ""
            raise SettingsError(f"{prefix}{setting.name} must be {what}{also}, got {value!r}")


@dataclass(frozen=True)
class WarmThroughput:
    """Read and write units per second a table or index absorbs at once (DynamoDB's warm
    throughput): at least a new on-demand table's, at most the account's table quota."""

    read_units_per_second: int
    write_units_per_second: int

    def check(self, setting: str, table_quota: float) -> None:
        for kind, value, least in (
            ("read", self.read_units_per_second, plan_limits.DEFAULT_WARM_READS),
            ("write", self.write_units_per_second, plan_limits.DEFAULT_WARM_WRITES),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= table_quota:
                raise SettingsError(
                    f"{setting}: {kind}_units_per_second must be between {least:,} (a new on-demand table's) and "
                    f"{table_quota:,.0f} (the table quota; raise it in quotas), got {value!r}"
                )

    def as_plan(self) -> dict[str, int]:
        return {"read": self.read_units_per_second, "write": self.write_units_per_second}


_CAPACITY = plan_environments.MESSAGES_CAPACITY_DEFAULTS
ON_DEMAND, PROVISIONED = plan_environments.ON_DEMAND, plan_environments.PROVISIONED
CAPACITY_MODES = plan_environments.CAPACITY_MODES


@dataclass(frozen=True, kw_only=True)
class MessagesCapacity:
    """How the messages table is billed: on-demand, or provisioned capacity that DynamoDB
    autoscaling keeps at ``target_utilisation`` between the bounds (the table and its
    markers index; the index's writes are skip markers only, its floor the default's).
    ``wsfleet plan --env NAME --connections N --rate R`` sizes them; a crash's new owners
    each read a connection's stored end within seconds, faster than autoscaling, so
    ``min_read_units`` must hold them (the plan says how many)."""

    billing: str = _CAPACITY["billing"]
    min_write_units: int = _CAPACITY["min_write_units"]
    max_write_units: int = _CAPACITY["max_write_units"]
    min_read_units: int = _CAPACITY["min_read_units"]
    max_read_units: int = _CAPACITY["max_read_units"]
    target_utilisation: float = _CAPACITY["target_utilisation"]

    def __post_init__(self) -> None:
        check_types(self, "messages_capacity.")
        if self.billing not in CAPACITY_MODES:
            raise SettingsError(
                f"messages_capacity.billing must be {' or '.join(repr(m) for m in CAPACITY_MODES)}, got {self.billing!r}"
            )
        if self.billing == ON_DEMAND:
            given = [f.name for f in dataclasses.fields(self) if f.name != "billing" and getattr(self, f.name) != _CAPACITY[f.name]]
            if given:
                raise SettingsError(
                    f"messages_capacity.{given[0]} applies only to billing = \"{PROVISIONED}\": an on-demand table "
                    "has no capacity to bound"
                )
            return
        for kind in ("write", "read"):
            low, high = getattr(self, f"min_{kind}_units"), getattr(self, f"max_{kind}_units")
            if not 1 <= low <= high:
                raise SettingsError(
                    f"messages_capacity: min_{kind}_units must be at least 1 and at most max_{kind}_units, got {low} and {high}"
                )
        low, high = plan_environments.TARGET_UTILISATION_RANGE
        if not low <= self.target_utilisation <= high:
            raise SettingsError(
                f"messages_capacity.target_utilisation must be between {low} and {high} (what DynamoDB autoscaling "
                f"targets), got {self.target_utilisation}"
            )

    def check(self, table_quota: float) -> None:
        """The most it may scale to is within the account's table quota."""
        for kind in ("write", "read"):
            high = getattr(self, f"max_{kind}_units")
            if self.billing == PROVISIONED and high > table_quota:
                raise SettingsError(
                    f"messages_capacity.max_{kind}_units {high:,} is above the table quota ({table_quota:,.0f}): "
                    "raise it in quotas.table_units first"
                )

    @property
    def provisioned(self) -> bool:
        return self.billing == PROVISIONED


# Kinesis keeps records 24 hours at least and 365 days at most.
MIN_STREAM_RETENTION_HOURS, MAX_STREAM_RETENTION_HOURS = 24, 8760
STREAM_KMS_AWS_MANAGED = "aws-managed"  # the aws/kinesis key: no key policy or grant to keep
STREAM_KMS_CUSTOMER_MANAGED = "customer-managed"  # a key of the stack's own, rotated yearly
STREAM_KMS_CHOICES = (STREAM_KMS_AWS_MANAGED, STREAM_KMS_CUSTOMER_MANAGED)
# Where the reference consumer's event source mapping starts reading a stream it has not
# read before: the oldest record kept (nothing the workers put before it was created is
# missed), or only records put after it.
CONSUMER_STARTING_POSITIONS = ("TRIM_HORIZON", "LATEST")
# Lambda's limits for a Kinesis event source mapping.
MAX_CONSUMER_BATCH_SIZE = 10_000
MAX_CONSUMER_BATCHING_WINDOW_SECONDS = 300
MAX_CONSUMER_RETRY_ATTEMPTS = 10_000


@dataclass(frozen=True, kw_only=True)
class ConsumerSettings:
    """The reference consumer (``wsfleet.consumer.handler``): a Lambda function on the
    messages stream that delivers each (connection, seq) once to an S3 bucket of its own."""

    # A batch costs one S3 object and one state write per connection in it, whatever
    # its number of records: a batch must hold many frames of each connection for the
    # consumer to cost less than the messages table (`wsfleet plan` prices it). So the
    # batch is as large as Lambda allows (records; Lambda cuts it at 6 MB of payload),
    # and waits up to the window for records to gather.
    batch_size: int = MAX_CONSUMER_BATCH_SIZE
    max_batching_window_seconds: int = 30
    starting_position: str = "TRIM_HORIZON"
    # A failing batch is split in two and each half retried, so that one record the
    # consumer cannot handle holds up as few others as possible.
    bisect_on_error: bool = True
    # None: retry a failing batch until its records leave the stream (the iterator-age
    # alarm fires long before); a number: give up after that many retries, and the batch's
    # shard and sequence numbers go to the failure queue (its records are not delivered).
    retry_attempts: int | None = None
    # CONSUMER_PREFIX: the output objects' key prefix
    prefix: str = settings_spec.VARIABLES[settings_spec.CONSUMER_PREFIX].default
    output_ttl_days: int = 0  # output objects expire after this many days; 0 keeps them
    # The consumer is this far behind the stream's newest record: alarm.
    iterator_age_alarm_seconds: int = 600

    def __post_init__(self) -> None:
        check_types(self, "consumer.")
        if not 1 <= self.batch_size <= MAX_CONSUMER_BATCH_SIZE:
            raise SettingsError(f"consumer.batch_size must be between 1 and {MAX_CONSUMER_BATCH_SIZE}")
        if not 0 <= self.max_batching_window_seconds <= MAX_CONSUMER_BATCHING_WINDOW_SECONDS:
            raise SettingsError(
                f"consumer.max_batching_window_seconds must be between 0 and {MAX_CONSUMER_BATCHING_WINDOW_SECONDS}"
            )
        if self.starting_position not in CONSUMER_STARTING_POSITIONS:
            raise SettingsError(
                f"consumer.starting_position must be {' or '.join(CONSUMER_STARTING_POSITIONS)}, "
                f"got {self.starting_position!r}"
            )
        if self.retry_attempts is not None and not 0 <= self.retry_attempts <= MAX_CONSUMER_RETRY_ATTEMPTS:
            raise SettingsError(
                f"consumer.retry_attempts must be None (until the records expire) or between 0 and "
                f"{MAX_CONSUMER_RETRY_ATTEMPTS}"
            )
        # The consumer's own parser (CONSUMER_PREFIX): the stack grants PutObject under
        # exactly what it will write under.
        try:
            parsed = config.consumer_prefix({settings_spec.CONSUMER_PREFIX: self.prefix})
        except ConfigError as error:
            raise SettingsError(f"consumer.prefix: {error}") from None
        if parsed != self.prefix:
            raise SettingsError(f"consumer.prefix must be a non-empty S3 key prefix without blanks, got {self.prefix!r}")
        if self.output_ttl_days < 0:
            raise SettingsError("consumer.output_ttl_days must be 0 (no expiry) or more")
        if self.iterator_age_alarm_seconds < 60:
            raise SettingsError("consumer.iterator_age_alarm_seconds must be at least 60")


# --- tracing (TRACING; docs/tracing.md) ---------------------------------------------
# The runtime's own names for its modes (wsfleet.tracing decides what each does).
TRACING_XRAY_SDK, TRACING_OTEL, TRACING_OFF = tracing.XRAY_SDK, tracing.OTEL, tracing.OFF
TRACING_MODES = tracing.MODES
# In otel, how the router's spans reach X-Ray: through the AWS-managed ADOT collector
# extension layer, or exported by the function itself to X-Ray's OTLP endpoint.
LAMBDA_OTEL_LAYER, LAMBDA_OTEL_SDK = "layer", "sdk"
LAMBDA_OTEL_PATHS = (LAMBDA_OTEL_LAYER, LAMBDA_OTEL_SDK)
# The X-Ray SDKs and daemon are in maintenance mode; AWS ends their support on this day.
XRAY_SDK_END_OF_SUPPORT = "2027-02-25"


@dataclass(frozen=True, kw_only=True)
class TracingSettings:
    """How the worker and the router trace (the ``TRACING`` they are given), and what the
    stacks deploy for it (``stacks/tracing.py``): ``xray-sdk`` an X-Ray daemon sidecar,
    ``otel`` an ADOT collector sidecar and, for the router, ``lambda_otel``'s path,
    ``off`` nothing at all."""

    mode: str = TRACING_XRAY_SDK
    lambda_otel: str = LAMBDA_OTEL_LAYER  # only read in otel
    # In otel, the share of the traces the fleet starts itself that are kept
    # (OTEL_TRACES_SAMPLER_ARG); a trace that comes in (an API call, a hint) keeps its
    # caller's decision.
    sample_ratio: float = 0.05

    def __post_init__(self) -> None:
        if self.mode not in TRACING_MODES:
            raise SettingsError(f"tracing.mode must be {', '.join(TRACING_MODES)}, got {self.mode!r}")
        if self.lambda_otel not in LAMBDA_OTEL_PATHS:
            raise SettingsError(
                f"tracing.lambda_otel must be {' or '.join(LAMBDA_OTEL_PATHS)}, got {self.lambda_otel!r}"
            )
        ratio = self.sample_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
            raise SettingsError(f"tracing.sample_ratio must be a number between 0 and 1, got {ratio!r}")
