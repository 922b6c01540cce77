"""The README's guide, walked as a newcomer would, against the embedded default where it
needs AWS: the environment file it shows is one synth accepts, the mistake it shows is
refused with the sentence it quotes, and its commands, from the secret to the messages,
print what it says they print."""

from __future__ import annotations

import io
import re
import shlex
import tomllib
from pathlib import Path

import boto3
import pytest

from sim.api import LocalApi
from stacks.environment_files import load_environment, settings_from
from stacks.settings_parts import SettingsError
from tests.test_cli import make_stacks, run
from tests.test_router_messages import Stored
from wsfleet import settings_spec as spec
from wsfleet.logs import JsonLogger
from wsfleet.router import Router

README = Path(__file__).resolve().parents[1] / "README.md"


def section(heading: str) -> str:
    """The README's text under ``heading`` (a ``###`` step), up to the next heading."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    end = re.compile(r"\n#{2,3} ").search(text, start + 1)
    return text[start: end.start() if end else len(text)]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)\n```", text, flags=re.DOTALL)


def commands(block: str) -> list[tuple[str, list[str]]]:
    """Each command of a shell block (continuation lines joined, its trailing comment
    dropped) with the ``# ...`` lines right under it: what the guide says it prints."""
    out: list[tuple[str, list[str]]] = []
    for line in block.replace("\\\n", " ").splitlines():
        if line.startswith("# ") and out:
            out[-1][1].append(line[2:])
        elif line.strip():
            out.append((re.sub(r"\s+#\s.*$", "", line).strip(), []))
    return out


def the_environment_file() -> tuple[str, dict]:
    (block,) = blocks(section("### 2. Your environment: one file, `environments/<name>.toml`"), "toml")
    name = re.match(r"# environments/([\w-]+)\.toml\n", block).group(1)
    return name, tomllib.loads(block)


def test_the_guides_environment_file_is_one_synth_takes_and_its_mistake_reads_as_quoted(tmp_path):
    name, values = the_environment_file()
    settings = settings_from(name, values)
    assert settings.allowed_ws_hosts and settings.secret_prefix == f"wsfleet/{name}/"
    # The mistake the guide shows, word for word.
    text = section("### 2. Your environment: one file, `environments/<name>.toml`")
    quoted = re.search(r"\(`(environments/[\w-]+\.toml: [^`]+)`\)", text).group(1)
    (tmp_path / "environments").mkdir()
    (tmp_path / "environments" / f"{name}.toml").write_text("max_worker = 4\n")
    with pytest.raises(SettingsError) as refused:
        load_environment(tmp_path / "environments", name)
    assert str(refused.value) == str(tmp_path / quoted)


def test_the_guide_from_a_secret_to_reading_messages_runs_on_the_embedded_default(capsys, aws_env, emulator, ddb):
    name, values = the_environment_file()
    settings = settings_from(name, values)
    region = aws_env["AWS_REGION"]

    # Step 3: the secret, tagged with the hosts it may go to; its ARN as the guide shows it.
    ((create, shown),) = commands(blocks(section("### 3. Your upstream secrets"), "sh")[0])
    args = shlex.split(create)
    assert args[:3] == ["aws", "secretsmanager", "create-secret"]
    flag = {args[i]: args[i + 1] for i in range(3, len(args) - 1) if args[i].startswith("--")}
    tag = dict(part.split("=", 1) for part in flag["--tags"].split(","))
    secrets = boto3.client("secretsmanager", endpoint_url=emulator.endpoint_url, region_name=region)
    arn = secrets.create_secret(Name=flag["--name"], SecretString=flag["--secret-string"],
                                Tags=[{"Key": tag["Key"], "Value": tag["Value"]}])["ARN"]
    (example,) = shown
    pattern = re.escape(example)
    for part in ("eu-west-1", "123456789012", "AbCdEf"):
        pattern = pattern.replace(re.escape(part), r"[\w-]+")
    assert re.fullmatch(pattern, arn), (arn, example)
    assert flag["--name"].startswith(settings.secret_prefix) and tag["Value"] in settings.allowed_ws_hosts

    # Step 4's outputs: the environment's two stacks, as a deploy leaves them.
    router = Router.from_env(
        {**aws_env, spec.ALLOWED_WS_HOSTS: ",".join(settings.allowed_ws_hosts), spec.UPSTREAM_SECRET_PREFIX: settings.secret_prefix},
        logger=JsonLogger(io.StringIO(), component="router"),
    )
    with LocalApi(router.handle) as api:
        make_stacks(emulator, aws_env, api, {"stateful": f"wsfleet-{name}-stateful", "service": f"wsfleet-{name}-service"})
        env = {k: v for k, v in aws_env.items() if not k.endswith("TABLE_NAME")}

        # Step 5: the environment named once, the CLI's version, the START.
        variables: dict[str, str] = {}
        steps = commands(blocks(section("### 5. Install the CLI and START a connection"), "sh")[0])
        ran = []
        for command, shown in steps:
            if command.startswith("export WSFLEET_ENV="):
                env["WSFLEET_ENV"] = command.split("=", 1)[1]
            elif re.match(r"^[A-Z]+=", command):
                key, value = command.split("=", 1)
                variables[key] = arn if key == "ARN" else value
            elif command.startswith("wsfleet "):
                argv = shlex.split(command.replace("$ARN", variables.get("ARN", "")))[1:]
                code, out, err = run(capsys, env, *argv)
                assert (code, err) == (0, ""), (command, err)
                assert out.splitlines()[: len(shown)] == shown, command
                ran.append(argv[0])
        assert ran == ["--version", "start"] and env["WSFLEET_ENV"] == name

        # What a worker stores once it holds the connection, then step 6's reads.
        connection_id = "feed-1"
        Stored(ddb, aws_env, emulator).inline(connection_id, range(1, 9))
        steps = commands(blocks(section("### 6. See it run and read the messages"), "sh")[0])
        outputs = {}
        for command, _ in steps:
            argv = shlex.split(command)[1:]
            if "--follow" in argv:
                continue  # runs until Ctrl-C: tests/test_cli_reading.py follows messages
            code, out, err = run(capsys, env, *argv)
            assert (code, err) == (0, ""), (command, err)
            outputs[" ".join(argv)] = out
        assert list(outputs) == ["get feed-1", "status", "messages feed-1 --limit 5"]
        assert "STARTED" in outputs["get feed-1"] and "wss://stream.example.com/v1/stream" in outputs["get feed-1"]
        assert arn in outputs["get feed-1"] and flag["--secret-string"] not in outputs["get feed-1"]
        assert "STARTED" in outputs["status"]
        assert outputs["messages feed-1 --limit 5"].splitlines() == [f'{s}  {{"v":{s}}}' for s in range(1, 6)]

        # The prose's stop, restart and delete.
        prose = " ".join(section("### 6. See it run and read the messages").split())
        lifecycle = re.findall(r"`(wsfleet (?:stop|restart|delete) feed-1)`", prose)
        assert lifecycle == ["wsfleet stop feed-1", "wsfleet restart feed-1", "wsfleet delete feed-1"]
        for command in ("wsfleet restart feed-1", "wsfleet stop feed-1", "wsfleet delete feed-1"):
            code, out, err = run(capsys, env, *shlex.split(command)[1:])
            assert (code, err) == (0, ""), (command, err)
        code, _, err = run(capsys, env, "get", "feed-1")
        assert code == 1 and "feed-1" in err
