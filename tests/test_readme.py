"""The docs' generated parts match what they are generated from: a test fails when the
docs drift from the declaration (STYLE: one declaration, the docs built from it)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from wsfleet import metrics_names, upstream_spec
from wsfleet.cli import build_parser

DOCS = Path(__file__).resolve().parents[1] / "docs"
API = DOCS / "api.md"
CLI = DOCS / "cli.md"


def generated_block(name: str) -> str:
    """The text between ``<!-- name -->`` and ``<!-- /name -->``, which must occur once."""
    text = API.read_text(encoding="utf-8")
    blocks = re.findall(rf"<!-- {name} -->\n(.*?)\n<!-- /{name} -->", text, flags=re.DOTALL)
    assert len(blocks) == 1, f"docs/api.md must hold one <!-- {name} --> ... <!-- /{name} --> block"
    return blocks[0]


def test_the_api_docs_upstream_table_is_the_one_upstream_spec_generates():
    expected = upstream_spec.markdown_table()
    assert generated_block("upstream-table") == expected, (
        "docs/api.md's upstream table differs from upstream_spec.FIELDS: paste "
        "`python -c 'from wsfleet import upstream_spec; print(upstream_spec.markdown_table())'` between the markers"
    )


def test_every_upstream_flag_appears_in_the_cli_reference():
    cli = CLI.read_text(encoding="utf-8")
    for f in upstream_spec.FIELDS:
        assert f.flag in cli, f"{f.flag} is not documented in docs/cli.md"


OPERATIONS = DOCS / "operations.md"
ALARMS_SOURCE = DOCS.parent / "stacks" / "constructs" / "alarms.py"


def test_the_operations_docs_name_every_alarm_the_stacks_create():
    names = re.findall(r'alarm_name=f"\{prefix\}-([a-z0-9-]+)"', ALARMS_SOURCE.read_text(encoding="utf-8"))
    assert len(names) >= 15
    text = OPERATIONS.read_text(encoding="utf-8")
    missing = [name for name in names if f"`{name}`" not in text]
    assert missing == [], f"docs/operations.md does not say what to do about {missing}"


def test_the_operations_docs_name_every_metric_the_fleet_publishes():
    published = {
        value for name, value in vars(metrics_names).items()
        if name.isupper() and isinstance(value, str) and re.fullmatch(r"(?:[A-Z][a-z0-9]+)+(?:Ms|P99)?", value)
    } - {metrics_names.DEFAULT_NAMESPACE, metrics_names.DIMENSION_SERVICE_NAME, metrics_names.DIMENSION_WORKER_ID}
    assert metrics_names.ACTIVE_CONNECTIONS in published and metrics_names.SEQS_ABANDONED in published
    text = OPERATIONS.read_text(encoding="utf-8")
    assert sorted(m for m in published if f"`{m}`" not in text) == []


# --- every link opens ------------------------------------------------------------------------

ROOT = DOCS.parent
GUIDES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (outside code blocks)."""
    found, fenced = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6} (.*)", line)):
            found.add(re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-"))
    return found


def test_every_link_of_the_readme_and_the_docs_opens_a_file_and_a_heading_that_exist():
    broken = []
    for page in GUIDES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+://", target):
                continue
            name, _, anchor = target.partition("#")
            path = (page.parent / name).resolve() if name else page
            if not path.exists() or (anchor and anchor not in anchors(path)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_the_readme_the_docs_and_the_benchmarks_cite_nothing_a_reader_cannot_open():
    for page in [*GUIDES, ROOT / "BENCHMARKS.md"]:
        text = page.read_text(encoding="utf-8")
        assert "CONTRACT" not in text, page
        assert not re.search(r"\bissues? #?\d+", text, flags=re.IGNORECASE), page


# --- every wsfleet command the guide shows parses ------------------------------------------------


def shown_commands(page: Path) -> list[str]:
    """The ``wsfleet ...`` lines of a page's shell blocks, continuations joined."""
    blocks = re.findall(r"```sh\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [line for line in lines if line.startswith("wsfleet ")]


@pytest.mark.parametrize("page", ["README.md", "docs/cli.md"])
def test_every_wsfleet_command_the_guide_shows_is_one_the_cli_takes(page):
    commands = shown_commands(ROOT / page)
    assert len(commands) >= 5
    parser = build_parser()
    for line in commands:
        line = line.replace("$ARN", "arn:aws:secretsmanager:eu-west-1:123456789012:secret:wsfleet/mine/k-AbCdEf")
        argv = shlex.split(re.sub(r"<[^>]*>", "x", line), comments=True)[1:]
        try:
            args = parser.parse_args(argv)
        except SystemExit as exit_:  # --help and --version exit 0; a usage error exits 2
            assert exit_.code == 0, line
            continue
        assert callable(args.run), line
