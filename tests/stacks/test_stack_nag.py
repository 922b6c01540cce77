"""cdk-nag's AwsSolutions pack finds nothing unacknowledged, in any environment, and
every acknowledgement is made in stacks/nag.py with a reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from aws_cdk import Validations
from aws_cdk import aws_sqs as sqs
from cdk_nag import AwsSolutionsChecks

from app import create_stacks

STACKS_DIR = Path(__file__).resolve().parents[2] / "stacks"


def _acknowledgements(construct) -> dict[str, str]:
    """cdk-nag acknowledgements ("<path> <rule id>": reason); CDK makes a few of its own."""
    found = {}
    for child in construct.node.find_all():
        for entry in child.node.metadata:
            if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
                found.update({f"{child.node.path} {k}": v for k, v in entry.data.items() if "AwsSolutions-" in k})
    return found


def test_synth_passes_its_validation_plugins(env):
    assert env.validation_error is None


def test_aws_solutions_checks_report_no_unacknowledged_finding(env):
    report = AwsSolutionsChecks().validate_scope(env.app)
    findings = [
        f"{v.rule_name} at {', '.join(r.construct_path for r in v.violating_resources)}"
        for v in report.violations
    ]
    assert findings == []
    assert report.success


def test_synth_fails_on_a_finding_nobody_acknowledged(new_app):
    app = new_app("dev")
    _, service = create_stacks(app)
    sqs.Queue(service, "UnencryptedQueue", encryption=sqs.QueueEncryption.UNENCRYPTED)
    with pytest.raises(RuntimeError, match=r"ValidationFailed(.|\n)*AwsSolutions-SQS2"):
        app.synth()


def test_every_acknowledgement_names_a_rule_and_gives_a_reason(env):
    acknowledgements = _acknowledgements(env.app)
    assert acknowledgements
    for where, reason in acknowledgements.items():
        assert re.search(r" (Annotation::)?AwsSolutions-[A-Z]+[0-9]+(\[.+\])?$", where), where
        assert len(reason) >= 40, f"{where}: give a real reason, not {reason!r}"


def test_acknowledgements_are_made_only_in_stacks_nag(env):
    callers = [
        path.relative_to(STACKS_DIR).as_posix()
        for path in STACKS_DIR.rglob("*.py")
        if ".acknowledge(" in path.read_text()
    ]
    assert callers == ["nag.py"]


def test_dev_alone_acknowledges_missing_point_in_time_recovery(synthesized):
    assert any("AwsSolutions-DDB3" in k for k in _acknowledgements(synthesized["dev"].app))
    assert not any("AwsSolutions-DDB3" in k for k in _acknowledgements(synthesized["prod"].app))


def test_a_kinesis_only_app_passes_cdk_nag_too(kinesis_only):
    assert kinesis_only.validation_error is None
    assert AwsSolutionsChecks().validate_scope(kinesis_only.app).success
