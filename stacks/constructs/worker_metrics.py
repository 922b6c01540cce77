"""The metrics the workers publish, as the alarms and the dashboard read them."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch

from wsfleet import metrics_names


def worker_metric(
    namespace: str, service_name: str, metric_name: str, *, period: Duration, statistic: str, label: str | None = None
) -> cloudwatch.Metric:
    """One of the workers' metrics for the whole service (dimension ServiceName)."""
    return cloudwatch.Metric(
        namespace=namespace,
        metric_name=metric_name,
        dimensions_map={metrics_names.DIMENSION_SERVICE_NAME: service_name},
        period=period,
        statistic=statistic,
        label=label,
    )
