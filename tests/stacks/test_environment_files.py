"""Environments as data (environments/<name>.toml, stacks/environment_files.py): a new
file is a new environment with no code changed, every mistake in one is a sentence naming
the file and the setting, and the plan reads the same file the stacks deploy."""

from __future__ import annotations

import pytest
from aws_cdk import Stack
from aws_cdk import aws_logs as logs

import app as cdk_app
from stacks.environment_files import load_environment
from stacks.settings import EnvironmentSettings
from stacks.settings_parts import SettingsError
from stacks.synth import with_context
from wsfleet.cli import main
from wsfleet.plan import environments as plan_environments

STAGING = """\
# A third environment: a file, nothing else.
max_workers = 8
log_retention = "TWO_WEEKS"
allowed_ws_hosts = ["feeds.example.net"]

[tracing]
mode = "off"
"""


def test_a_new_file_is_a_new_environment_the_app_deploys(new_app, tmp_path, monkeypatch):
    (tmp_path / "staging.toml").write_text(STAGING)
    monkeypatch.setattr(cdk_app, "ENVIRONMENTS", cdk_app.load_all(tmp_path))
    staging = cdk_app.ENVIRONMENTS["staging"]
    assert staging == EnvironmentSettings(
        name="staging", max_workers=8, log_retention=logs.RetentionDays.TWO_WEEKS,
        allowed_ws_hosts=("feeds.example.net",), tracing=staging.tracing,
    )
    assert staging.tracing.mode == "off"
    app = new_app("dev")
    app.node.set_context("env", "staging")
    stateful, service = cdk_app.create_stacks(app)
    assert [s.stack_name for s in (stateful, service)] == ["wsfleet-staging-stateful", "wsfleet-staging-service"]
    assert [c for c in app.node.children if isinstance(c, Stack)] == [stateful, service]
    # The plan reads the same file, with the same defaults for what it leaves out.
    assert plan_environments.load("staging", {"WSFLEET_ENVIRONMENTS": str(tmp_path)}) == staging.plan_settings


@pytest.mark.parametrize(
    "text, sentence",
    [
        ("max_worker = 8\n", "max_worker is not a setting (did you mean max_workers?)"),
        ('max_workers = "8"\n', "max_workers must be a whole number, got '8'"),
        ('log_retention = "A_WEEK"\n', "log_retention must be one of ONE_DAY, "),
        ("allowed_ws_hosts = \"*.example.com\"\n", "allowed_ws_hosts must be a list of strings"),
        ("tracing = \"otel\"\n", "tracing must be a table ([tracing] and its settings)"),
        ("[tracing]\nmodes = \"otel\"\n", "tracing.modes is not a setting; tracing takes lambda_otel, mode, sample_ratio"),
        ("[connections_warm_throughput]\nread_units_per_second = 20000\n", "connections_warm_throughput: "),
        ("max_workers = \n", "not TOML: "),
        ("min_workers = 5\nmax_workers = 4\n", "min_workers must be at least 1 and at most max_workers"),
    ],
)
def test_every_mistake_in_a_file_is_a_sentence_naming_the_file_and_the_setting(tmp_path, text, sentence):
    (tmp_path / "broken.toml").write_text(text)
    with pytest.raises(SettingsError) as refused:
        load_environment(tmp_path, "broken")
    assert str(refused.value).startswith(f"{tmp_path / 'broken.toml'}: {sentence}")


def test_a_missing_environment_names_the_ones_there_are(tmp_path):
    (tmp_path / "qa.toml").write_text("")
    with pytest.raises(SettingsError, match=r"no environment 'staging': .*staging.toml does not exist \(environments in .*: qa\)"):
        load_environment(tmp_path, "staging")
    assert load_environment(tmp_path, "qa") == EnvironmentSettings(name="qa")  # an empty file: every default


def test_the_upstream_hosts_can_be_given_at_synth_time():
    dev = cdk_app.ENVIRONMENTS["dev"]
    changed = with_context(dev, {"allowed_ws_hosts": "a.example.com, *.b.example.com"}.get)
    assert changed.allowed_ws_hosts == ("a.example.com", "*.b.example.com")
    with pytest.raises(SettingsError, match=r"^allowed_ws_hosts entries must be .*\(with -c allowed_ws_hosts=a.\*.example.com\)"):
        with_context(dev, {"allowed_ws_hosts": "a.*.example.com"}.get)


def test_plan_names_a_missing_environment_with_a_sentence(tmp_path, capsys):
    (tmp_path / "qa.toml").write_text("")
    assert main(["plan", "--connections", "1000", "--env", "staging"], env={"WSFLEET_ENVIRONMENTS": str(tmp_path)}) != 0
    err = capsys.readouterr().err
    assert "--env staging: no environment 'staging'" in err and "(environments in" in err and ": qa)" in err
    assert "Traceback" not in err


# --- docs/configuration.md lists every setting with its default ---------------------------------


def _toml(value) -> str:
    """A default as an environment file writes it; none where a file cannot (None)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple):
        return "`[" + ", ".join(f'"{v}"' for v in value) + "]`"
    if isinstance(value, dict):
        return "`{" + ", ".join(f"{k} = {v}" for k, v in value.items()) + "}`"
    if isinstance(value, logs.RetentionDays):
        return f'`"{value.name}"`'
    return f"`{value!r}`"


def test_the_configuration_docs_list_every_setting_with_its_default():
    import dataclasses
    import re
    from pathlib import Path

    from stacks.settings_parts import ConsumerSettings, MessagesCapacity, TracingSettings

    def default(f):
        return f.default if f.default is not dataclasses.MISSING else f.default_factory()

    expected = {
        f.name: _toml(default(f))
        for f in dataclasses.fields(EnvironmentSettings)
        if f.name not in ("name", "consumer", "tracing", "messages_capacity")
    }
    for prefix, part in (("consumer", ConsumerSettings), ("tracing", TracingSettings),
                         ("messages_capacity", MessagesCapacity)):
        expected |= {f"{prefix}.{f.name}": _toml(default(f)) for f in dataclasses.fields(part)}
    text = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text(encoding="utf-8")
    section = text[text.index("### Every setting") : text.index("### Overrides on the command line")]
    documented = dict(re.findall(r"^\| `([a-z_.]+)` \| (.*?) \|", section, flags=re.MULTILINE))
    assert documented == expected
