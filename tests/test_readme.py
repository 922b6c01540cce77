"""The README's generated parts match what they are generated from: a test fails when
the README drifts from the declaration (STYLE: one declaration, the docs built from it)."""

from __future__ import annotations

import re
from pathlib import Path

from wsfleet import upstream_spec

README = Path(__file__).resolve().parents[1] / "README.md"


def generated_block(name: str) -> str:
    """The text between ``<!-- name -->`` and ``<!-- /name -->``, which must occur once."""
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(rf"<!-- {name} -->\n(.*?)\n<!-- /{name} -->", text, flags=re.DOTALL)
    assert len(blocks) == 1, f"README.md must hold one <!-- {name} --> ... <!-- /{name} --> block"
    return blocks[0]


def test_the_readmes_upstream_table_is_the_one_upstream_spec_generates():
    expected = upstream_spec.markdown_table()
    assert generated_block("upstream-table") == expected, (
        "README.md's upstream table differs from upstream_spec.FIELDS: paste "
        "`python -c 'from wsfleet import upstream_spec; print(upstream_spec.markdown_table())'` between the markers"
    )


def test_every_upstream_flag_appears_in_the_readmes_cli_section():
    text = README.read_text(encoding="utf-8")
    cli = text[text.index("## Operators' CLI") :]
    for f in upstream_spec.FIELDS:
        assert f.flag in cli, f"{f.flag} is not documented in the README's CLI section"
