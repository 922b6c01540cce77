"""What ships: the router's code asset, the worker's image build context and the
Dockerfile, each holding the runtime package and its pinned requirements only."""

from __future__ import annotations

import json
import re
from pathlib import Path

from app import ENVIRONMENTS
from stacks import runtime_assets

DOCKERFILE = runtime_assets.RUNTIME_DIR / "Dockerfile"
# The operators' CLI and plan: in the package (pip install ./runtime), not in the worker
# image or the Lambda functions.
OPERATORS_ONLY = ("wsfleet/__main__.py", "wsfleet/cli/", "wsfleet/plan/", "wsfleet/measured_ops.json")


def _asset_dir(env, stack_name: str, asset_hash: str, kind: str) -> Path:
    manifest = json.loads(Path(env.assembly.directory, f"{stack_name}.assets.json").read_text())
    source = manifest[kind][asset_hash]["source"]
    return Path(env.assembly.directory, source.get("path") or source["directory"])


def _files(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}


def _router_code_dir(env) -> Path:
    functions = env.service_template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": "wsfleet.router.handler"}}
    )
    (function,) = functions.values()
    asset_hash = function["Properties"]["Code"]["S3Key"].removesuffix(".zip")
    return _asset_dir(env, env.service.stack_name, asset_hash, "files")


def _image_context_dir(env) -> Path:
    (task,) = env.service_template.find_resources("AWS::ECS::TaskDefinition").values()
    worker = next(c for c in task["Properties"]["ContainerDefinitions"] if c["Name"] == "worker")
    asset_hash = worker["Image"]["Fn::Sub"].rsplit(":", 1)[1]
    return _asset_dir(env, env.service.stack_name, asset_hash, "dockerImages")


def test_router_code_is_the_wsfleet_package_and_nothing_else(dev):
    files = _files(_router_code_dir(dev))
    assert {"wsfleet/__init__.py", "wsfleet/schema.py", "wsfleet/config.py"} <= files
    assert all(f.startswith("wsfleet/") and f.endswith(".py") for f in files), sorted(files)
    assert not any(f.startswith(OPERATORS_ONLY) or "__pycache__" in f for f in files)


def test_worker_image_context_is_the_dockerfile_requirements_and_package(dev):
    files = _files(_image_context_dir(dev))
    assert {"Dockerfile", ".dockerignore", "requirements.txt", "wsfleet/__init__.py"} <= files
    others = {f for f in files if not f.startswith("wsfleet/")}
    assert others == {"Dockerfile", ".dockerignore", "requirements.txt"}
    assert not any(f.startswith(OPERATORS_ONLY) or "__pycache__" in f for f in files)


def test_image_is_built_for_the_task_cpu_architecture(dev):
    manifest = json.loads(Path(dev.assembly.directory, f"{dev.service.stack_name}.assets.json").read_text())
    (image,) = manifest["dockerImages"].values()
    assert image["source"]["platform"] == "linux/amd64"


def test_worker_image_is_slim_non_root_and_runs_the_worker():
    text = DOCKERFILE.read_text()
    assert re.findall(r"^FROM (\S+)", text, re.MULTILINE) == ["${PYTHON_IMAGE}"]
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    assert re.fullmatch(r"python:\d+\.\d+-slim", base)
    users = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r'^ENTRYPOINT \["python", "-m", "wsfleet.worker"\]$', text, re.MULTILINE)
    assert "--requirement requirements.txt" in text


def test_worker_image_runs_the_python_the_test_suite_runs_it_on():
    # The worker is asyncio-heavy: it ships on the interpreter CI exercises (see the
    # Dockerfile); the router's Lambda runtime is the latest, as cdk-nag requires.
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=python:(\d+\.\d+)-slim$", DOCKERFILE.read_text(), re.MULTILINE)
    assert base == runtime_assets.WORKER_PYTHON
    # and every environment builds on that Python (its file may pin the image by digest)
    for settings in ENVIRONMENTS.values():
        assert settings.worker_base_image.startswith(f"python:{runtime_assets.WORKER_PYTHON}-slim")
