"""How ``runtime/`` becomes deployable artifacts: the router's code, its dependency
layer, and the worker's container image.

The router ships in two assets so that a code change never re-runs pip: the function
code is the ``wsfleet`` package as it is, and a layer holds the pinned third-party
packages of ``runtime/requirements.txt`` (the same pins the worker image installs).
The layer is built by pip on this machine for the Lambda platform (manylinux wheels
only), so neither synth nor deploy needs Docker for it; Docker is only the fallback
when pip cannot run here.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsii
from aws_cdk import AssetHashType, BundlingOptions, ILocalBundling
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_lambda as lambda_

RUNTIME_DIR = Path(__file__).resolve().parent.parent / "runtime"
REQUIREMENTS = "requirements.txt"

# One CPU architecture for every artifact. The wheels pip picks for the layer must match
# the Lambda runtime (the latest, as cdk-nag's Lambda rule requires). The worker image
# (runtime/Dockerfile) runs the Python the test suite runs the worker on.
LAMBDA_RUNTIME = lambda_.Runtime.PYTHON_3_14
WORKER_PYTHON = "3.11"
LAMBDA_ARCHITECTURE = lambda_.Architecture.X86_64
_PIP_PLATFORM = "manylinux2014_x86_64"
_PYTHON_VERSION = LAMBDA_RUNTIME.name.removeprefix("python")
# The worker's architecture is an environment's choice (worker_architecture): the task's
# runtime platform and the platform its image is built for, side by side.
_WORKER_PLATFORMS = {
    "arm64": (ecs.CpuArchitecture.ARM64, ecr_assets.Platform.LINUX_ARM64),
    "x86_64": (ecs.CpuArchitecture.X86_64, ecr_assets.Platform.LINUX_AMD64),
}

# The function code is the package only: no caches, no build files, and not the
# operators' CLI and plan (``wsfleet``'s __main__, cli/, plan/ and what plan reads),
# which no Lambda imports (tests/test_structure.py checks that from the imports).
_ROUTER_CODE_EXCLUDE = [
    "*",
    "!wsfleet",
    "!wsfleet/**",
    "wsfleet/__main__.py",
    "wsfleet/cli",
    "wsfleet/plan",
    "wsfleet/measured_ops.json",
    ".dockerignore",
    "**/__pycache__",
    "**/*.pyc",
]


@jsii.implements(ILocalBundling)
class _PipInstallForLambda:
    """Installs the pinned requirements into ``python/`` for the Lambda platform."""

    def try_bundle(self, output_dir: str, _options: Any) -> bool:
        if importlib.util.find_spec("pip") is None:
            return False  # no pip in this interpreter: let CDK bundle in Docker
        command = [
            sys.executable, "-m", "pip", "install",
            "--quiet", "--disable-pip-version-check", "--no-compile",
            "--only-binary=:all:", "--platform", _PIP_PLATFORM,
            "--implementation", "cp", "--python-version", _PYTHON_VERSION,
            "--target", str(Path(output_dir) / "python"),
            "--requirement", str(RUNTIME_DIR / REQUIREMENTS),
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"pip could not build the router's dependency layer:\n{result.stderr}")
        return True


def router_code() -> lambda_.Code:
    return lambda_.Code.from_asset(str(RUNTIME_DIR), exclude=_ROUTER_CODE_EXCLUDE)


def dependencies_layer_code() -> lambda_.Code:
    """The layer's content depends only on requirements.txt, so its hash does too."""
    return lambda_.Code.from_asset(
        str(RUNTIME_DIR),
        exclude=["*", f"!{REQUIREMENTS}"],
        asset_hash_type=AssetHashType.SOURCE,
        bundling=BundlingOptions(
            image=LAMBDA_RUNTIME.bundling_image,
            command=[
                "bash", "-c",
                f"pip install --no-compile --requirement {REQUIREMENTS} --target /asset-output/python",
            ],
            local=_PipInstallForLambda(),
        ),
    )


def worker_cpu_architecture(architecture: str) -> ecs.CpuArchitecture:
    """The task definition's CPU architecture for ``worker_architecture``."""
    return _WORKER_PLATFORMS[architecture][0]


def worker_image(architecture: str, base_image: str) -> ecs.ContainerImage:
    """Built from runtime/Dockerfile at deploy time for ``architecture`` (docker buildx
    emulates arm64 on an x86_64 machine) on ``base_image`` (its ``PYTHON_IMAGE``, part of
    the asset's hash); runtime/.dockerignore scopes its hash."""
    return ecs.ContainerImage.from_asset(
        str(RUNTIME_DIR), platform=_WORKER_PLATFORMS[architecture][1], build_args={"PYTHON_IMAGE": base_image},
    )
