"""Every environment's app, synthesized once per test session as ``cdk synth`` would:
the context of cdk.json plus ``env``, and cdk-nag running as a validation plugin.

One difference from the CLI: asset bundling is skipped (the CLI's own switch for it,
``aws:cdk:bundling-stacks``), so the tests never run pip for the router's layer.
The real bundling runs in ``make synth``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

# Node 20 is old for jsii: silence its banner instead of failing on it.
for _variable, _value in (
    ("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1"),
    ("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1"),
    ("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20"),
):
    os.environ.setdefault(_variable, _value)

from aws_cdk import App  # noqa: E402  (after the jsii switches above)
from aws_cdk.cx_api import CloudAssembly  # noqa: E402
from aws_cdk.assertions import Template  # noqa: E402

import app as cdk_app  # noqa: E402
from stacks.service_stack import ServiceStack  # noqa: E402
from stacks.settings import EnvironmentSettings  # noqa: E402
from stacks.settings_parts import TracingSettings  # noqa: E402
from stacks.stateful_stack import StatefulStack  # noqa: E402
from stacks.synth import with_context  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENVIRONMENTS = tuple(cdk_app.ENVIRONMENTS)


def cli_context(env: str) -> dict:
    """What the CLI passes for ``cdk synth -c env=<env>``, minus bundling."""
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    return {**context, "env": env, "aws:cdk:bundling-stacks": []}


@dataclass(frozen=True)
class Synthesized:
    settings: EnvironmentSettings
    app: App
    assembly: CloudAssembly
    validation_error: str | None
    stateful: StatefulStack
    service: ServiceStack
    stateful_template: Template
    service_template: Template

    def template(self, which: str) -> Template:
        return {"stateful": self.stateful_template, "service": self.service_template}[which]


def synthesize(env: str, outdir: Path, **overrides: str) -> Synthesized:
    """``cdk synth -c env=<env> [-c <key>=<value> ...]``, minus bundling."""
    app = App(context={**cli_context(env), **overrides}, outdir=str(outdir))
    stateful, service = cdk_app.create_stacks(app)
    try:
        assembly, validation_error = app.synth(), None
    except RuntimeError as error:
        # A validation plugin (cdk-nag) refused the app after the assembly was
        # written: keep testing the templates, and let the nag tests report it.
        assembly, validation_error = CloudAssembly(str(outdir)), str(error)
    return Synthesized(
        settings=with_context(cdk_app.ENVIRONMENTS[env], app.node.try_get_context),
        app=app,
        assembly=assembly,
        validation_error=validation_error,
        stateful=stateful,
        service=service,
        stateful_template=Template.from_json(assembly.get_stack_by_name(stateful.stack_name).template),
        service_template=Template.from_json(assembly.get_stack_by_name(service.stack_name).template),
    )


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Synthesized]:
    return {env: synthesize(env, tmp_path_factory.mktemp(f"cdk.out.{env}")) for env in ENVIRONMENTS}


def synthesize_with_tracing(env: str, outdir: Path, tracing: TracingSettings) -> Synthesized:
    """``env`` as app.py has it but for its tracing settings, synthesized as above."""
    changed = dataclasses.replace(cdk_app.ENVIRONMENTS[env], tracing=tracing)
    with mock.patch.dict(cdk_app.ENVIRONMENTS, {env: changed}):
        return synthesize(env, outdir)


@pytest.fixture(scope="session")
def tracing_off(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """dev with tracing off: no sidecar, no layer, no X-Ray anywhere."""
    return synthesize_with_tracing("dev", tmp_path_factory.mktemp("cdk.out.off"), TracingSettings(mode="off"))


@pytest.fixture(scope="session")
def otel_sdk(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """dev with the router exporting straight to X-Ray's OTLP endpoint (lambda_otel sdk)."""
    return synthesize_with_tracing(
        "dev", tmp_path_factory.mktemp("cdk.out.sdk"), TracingSettings(mode="otel", lambda_otel="sdk")
    )


@pytest.fixture(scope="session")
def kinesis_only(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """dev with the stream as its only sink, under the AWS managed key, with the
    reference consumer: what ``-c sink=kinesis -c stream_kms=aws-managed`` builds."""
    return synthesize("dev", tmp_path_factory.mktemp("cdk.out.kinesis"), sink="kinesis", stream_kms="aws-managed")


@pytest.fixture
def new_app(tmp_path: Path):
    """A fresh, empty App with the CLI's context for an environment."""

    def make(env: str) -> App:
        return App(context=cli_context(env), outdir=str(tmp_path / "cdk.out"))

    return make


@pytest.fixture(params=ENVIRONMENTS)
def env(request: pytest.FixtureRequest, synthesized: dict[str, Synthesized]) -> Synthesized:
    return synthesized[request.param]


@pytest.fixture
def dev(synthesized: dict[str, Synthesized]) -> Synthesized:
    return synthesized["dev"]


@pytest.fixture
def prod(synthesized: dict[str, Synthesized]) -> Synthesized:
    return synthesized["prod"]
