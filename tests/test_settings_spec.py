"""Every environment variable declared once (wsfleet.settings_spec): the validation, the
docs/configuration.md's tables and the stacks' environments come from the declaration."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from wsfleet import metrics_names, schema, settings_spec, tracing
from wsfleet.config import ConsumerConfig, RouterConfig, WorkerConfig
from wsfleet.settings_spec import VARIABLES, WHOLE, ConfigError
from wsfleet import budget

from tests.test_config import BASE

CONFIGURATION = Path(__file__).resolve().parents[1] / settings_spec.DOCS
CONSUMER_BASE = {"CONSUMER_BUCKET_NAME": "b", "CONSUMER_TABLE_NAME": "t", "AWS_REGION": "eu-west-1"}
PARSE = {
    settings_spec.WORKER: lambda env: WorkerConfig.from_env({**BASE, **env}),
    settings_spec.ROUTER: lambda env: RouterConfig.from_env({**BASE, **env}),
    settings_spec.CONSUMER: lambda env: ConsumerConfig.from_env({**CONSUMER_BASE, **env}),
}


def test_every_variable_has_a_reader_a_one_line_doc_and_a_default_within_its_bounds():
    for v in VARIABLES.values():
        assert v.readers and set(v.readers) <= set(settings_spec.READERS), v.name
        assert set(v.stack) <= set(v.readers), f"{v.name}: the stacks set it only for a reader that reads it"
        assert v.doc and "\n" not in v.doc, v.name
        if v.low is not None and v.default is not None:
            assert v.low <= v.default <= v.high, v.name


def test_the_declared_defaults_are_the_owning_modules_constants():
    assert VARIABLES[settings_spec.STATE_SHARDS].default == schema.DEFAULT_STATE_SHARDS
    assert VARIABLES[settings_spec.STATE_SHARDS].high == schema.MAX_STATE_SHARDS
    assert VARIABLES[settings_spec.METRICS_NAMESPACE].default == metrics_names.DEFAULT_NAMESPACE
    assert VARIABLES[settings_spec.SINK].default == ",".join(schema.DEFAULT_SINKS)
    assert VARIABLES[settings_spec.TRACING].default == tracing.XRAY_SDK
    assert VARIABLES[settings_spec.OTEL_TRACES_EXPORTER].default == tracing.OTLP
    assert VARIABLES[settings_spec.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT].default == tracing.DEFAULT_OTLP_ENDPOINT
    assert metrics_names.CONSUMER_SERVICE_NAME in VARIABLES[settings_spec.SERVICE_NAME].shown
    assert str(budget.FALLBACK_BYTES) in VARIABLES[settings_spec.MAX_BUFFERED_BYTES].shown


@pytest.mark.parametrize("reader", settings_spec.READERS)
def test_a_declared_default_written_out_means_what_leaving_it_unset_means(reader):
    """What the stacks write (Variable.text) is what the runtime parses back."""
    declared = [v for v in settings_spec.read_by(reader) if v.default is not None and not v.standard]
    assert declared
    unset = PARSE[reader]({})
    for v in declared:
        assert PARSE[reader]({v.name: v.text(v.default)}) == unset, v.name


@pytest.mark.parametrize("reader", [settings_spec.WORKER, settings_spec.ROUTER])
def test_a_whole_number_outside_its_declared_bounds_is_refused_naming_it(reader):
    bounded = [v for v in settings_spec.read_by(reader) if v.kind == WHOLE and v.low is not None and not v.standard]
    assert bounded
    for v in bounded:
        for value in (v.low - 1, v.high + 1):
            with pytest.raises(ConfigError, match=f"^{v.name} must be between {v.low} and {v.high}"):
                PARSE[reader]({v.name: str(value)})


def test_a_value_is_written_as_the_runtime_parses_it():
    assert VARIABLES[settings_spec.LEASE_SECONDS].text(10) == "10"
    assert VARIABLES[settings_spec.HEARTBEAT_SECONDS].text(2.5) == "2.5"
    assert VARIABLES[settings_spec.REBALANCE].text(False) == "off"
    assert VARIABLES[settings_spec.MAX_FRAME_BYTES].text(32 << 20) == "33554432"
    assert VARIABLES[settings_spec.ALLOWED_WS_HOSTS].text(("a.example.com", "*.b.io")) == "a.example.com,*.b.io"


def test_an_environment_naming_a_variable_its_reader_does_not_read_is_refused():
    assert settings_spec.environment(settings_spec.ROUTER, {"STATE_SHARDS": "4"}) == {"STATE_SHARDS": "4"}
    with pytest.raises(ConfigError, match="the router reads no LEASE_SECONDS"):
        settings_spec.environment(settings_spec.ROUTER, {"STATE_SHARDS": "4", "LEASE_SECONDS": "10"})
    with pytest.raises(ConfigError, match="the consumer reads no TABEL_NAME"):
        settings_spec.environment(settings_spec.CONSUMER, {"TABEL_NAME": "t"})


def _block(name: str) -> str:
    text = CONFIGURATION.read_text(encoding="utf-8")
    blocks = re.findall(rf"<!-- {name} -->\n(.*?)\n<!-- /{name} -->", text, flags=re.DOTALL)
    assert len(blocks) == 1, f"docs/configuration.md must hold one <!-- {name} --> ... <!-- /{name} --> block"
    return blocks[0]


@pytest.mark.parametrize("reader", settings_spec.READERS)
def test_the_configuration_docs_table_of_variables_is_the_one_the_declaration_generates(reader):
    assert _block(f"variables-{reader}") == settings_spec.markdown_table(reader), (
        f"docs/configuration.md's {reader} variables differ from wsfleet.settings_spec.VARIABLES: "
        "run `PYTHONPATH=runtime python -m wsfleet.settings_spec`"
    )


def test_rewriting_current_docs_changes_nothing_and_fills_an_empty_block():
    text = CONFIGURATION.read_text(encoding="utf-8")
    assert settings_spec.rewrite(text) == text
    emptied = re.sub(r"(<!-- variables-router -->\n).*?(<!-- /variables-router -->)", r"\1\2", text, flags=re.DOTALL)
    assert emptied != text and settings_spec.rewrite(emptied) == text
