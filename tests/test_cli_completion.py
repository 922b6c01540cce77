"""``wsfleet completion bash|zsh``: the script, written from the parser, completes the
commands, a command's flags and a flag's choices when bash runs it."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.test_cli import run

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def complete(script: str, *cases: tuple[str, ...]) -> list[list[str]]:
    """What bash offers for the last word of each case (``wsfleet`` first), the script
    sourced once, in one bash process."""
    program = [script]
    for words in cases:
        line = " ".join(f"'{w}'" for w in words)
        program.append(f'COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _wsfleet; printf "%s\\n" "${{COMPREPLY[@]}}" ---')
    done = subprocess.run(["bash", "--norc", "-c", "\n".join(program)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return [sorted(filter(None, part.splitlines())) for part in done.stdout.split("---\n")[: len(cases)]]


@pytest.mark.slow  # starts bash
def test_bash_completes_commands_flags_and_choices(capsys):
    code, script, _ = run(capsys, {}, "completion", "bash")
    assert code == 0
    got = complete(
        script,
        ("wsfleet", "ap"),
        ("wsfleet", ""),
        ("wsfleet", "apply", "--dr"),
        ("wsfleet", "status", "--output", ""),
        ("wsfleet", "start", "c1", "ws://h/x", "--env", "dev", "--resume", "o"),
        ("wsfleet", "completion", "z"),
        ("wsfleet", "dr"),
        ("wsfleet", "drain", "w1", "--w"),
    )
    assert got[0] == ["apply"]
    assert {"logs", "status", "start", "completion", "--version"} <= set(got[1])
    assert got[2] == ["--dry-run"]
    assert got[3] == ["json", "text"]
    assert got[4] == ["open_message"]
    assert got[5] == ["zsh"]
    assert got[6] == ["drain"]
    assert got[7] == ["--wait"]


def test_zsh_gets_the_same_through_bashcompinit(capsys):
    code, out, err = run(capsys, {}, "completion", "zsh")
    assert (code, err) == (0, "") and "bashcompinit" in out and "complete -F _wsfleet wsfleet" in out
    code, _, err = run(capsys, {}, "completion", "fish")
    assert code == 2 and "invalid choice: 'fish'" in err
