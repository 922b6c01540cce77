"""Every stack of every environment as reviewed in CI: a snapshot of its template.

Asset hashes are replaced by a placeholder, so a change to runtime code (which changes
the hash of the function code and of the worker image) does not churn the snapshots;
a change to the infrastructure does. CDK's own usage metadata is left out for the same
reason. Update with ``pytest tests/stacks --snapshot-update`` and review the diff.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from syrupy.extensions.json import JSONSnapshotExtension

from app import ENVIRONMENTS

ASSET_HASH = re.compile(r"\b[0-9a-f]{64}\b")


def normalised(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: normalised(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalised(v) for v in value]
    if isinstance(value, str):
        return ASSET_HASH.sub("<asset-hash>", value)
    return value


def reviewable(template: dict) -> dict:
    template = dict(template)
    template["Resources"] = {
        k: v for k, v in template["Resources"].items() if v["Type"] != "AWS::CDK::Metadata"
    }
    conditions = {k: v for k, v in template.get("Conditions", {}).items() if k != "CDKMetadataAvailable"}
    if conditions:
        template["Conditions"] = conditions
    else:
        template.pop("Conditions", None)
    return normalised(template)


@pytest.fixture
def snapshot_json(snapshot):
    return snapshot.use_extension(JSONSnapshotExtension)


@pytest.mark.parametrize("stack", ["stateful", "service"])
@pytest.mark.parametrize("env_name", ENVIRONMENTS)
def test_template_matches_snapshot(synthesized, env_name, stack, snapshot_json):
    assert reviewable(synthesized[env_name].template(stack).to_json()) == snapshot_json


def test_normalising_hides_asset_hashes_only():
    digest = "ab" * 32
    assert normalised({"S3Key": f"{digest}.zip", "Image": f"repo:{digest}", "Name": "worker"}) == {
        "S3Key": "<asset-hash>.zip",
        "Image": "repo:<asset-hash>",
        "Name": "worker",
    }
