"""``wsfleet completion bash|zsh``: a shell completion script written from the argparse
parser itself, so that a new command or flag completes without editing it: the commands,
each command's flags, the values of a flag that has choices, and file names after a flag
that takes a file or a directory. zsh runs the bash script through ``bashcompinit``.
"""

from __future__ import annotations

import argparse
import shlex

# Flags whose value is a path: the shell completes file names after them.
PATH_METAVARS = frozenset({"FILE", "FILE.html", "FILE.svg", "DIR", "RUN_DIR"})


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """(every flag, choices by flag, flags taking a path); a positional's choices under ""."""
    flags, choices, paths = [], {}, []
    for action in parser._actions:
        if not action.option_strings and action.choices and not isinstance(action, argparse._SubParsersAction):
            choices[""] = [str(c) for c in action.choices]
        flags += action.option_strings
        for flag in action.option_strings:
            if action.choices:
                choices[flag] = [str(c) for c in action.choices]
            elif action.metavar in PATH_METAVARS:
                paths.append(flag)
    return flags, choices, paths


def bash(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    function = "_" + prog.replace("-", "_")
    commands = _subparsers(parser)
    top, _, _ = _flags(parser)
    flag_cases, value_cases = [], []
    for name, sub in commands.items():
        flags, choices, paths = _flags(sub)
        words = choices.pop("", [])
        flag_cases.append(f"        {name}) opts={shlex.quote(' '.join(flags))} words={shlex.quote(' '.join(words))} ;;")
        for flag, values in choices.items():
            value_cases.append(f'        "{name} {flag}") COMPREPLY=($(compgen -W {shlex.quote(" ".join(values))} -- "$cur")); return ;;')
        for flag in paths:
            value_cases.append(f'        "{name} {flag}") COMPREPLY=($(compgen -f -- "$cur")); return ;;')
    return "\n".join([
        f"# {prog} completion for bash: eval \"$({prog} completion bash)\", or save it under",
        "# /etc/bash_completion.d/ (or ~/.local/share/bash-completion/completions/" + prog + ").",
        f"{function}() {{",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" command="" opts="" words="" i',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        case "${COMP_WORDS[i]}" in -*) ;; *) command="${COMP_WORDS[i]}"; break ;; esac',
        "    done",
        '    if [[ -z "$command" ]]; then',
        f'        COMPREPLY=($(compgen -W {shlex.quote(" ".join([*commands, *top]))} -- "$cur"))',
        "        return",
        "    fi",
        '    case "$command $prev" in',
        *value_cases,
        "    esac",
        '    case "$command" in',
        *flag_cases,
        "    esac",
        '    if [[ "$cur" == -* ]]; then',
        '        COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
        '    elif [[ -n "$words" ]]; then',
        '        COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        "    else",
        '        COMPREPLY=($(compgen -f -- "$cur"))',
        "    fi",
        "}",
        f"complete -F {function} {prog}",
        "",
    ])


def zsh(parser: argparse.ArgumentParser) -> str:
    return "\n".join([
        f"# {parser.prog} completion for zsh: eval \"$({parser.prog} completion zsh)\" in ~/.zshrc (after compinit).",
        "autoload -U +X bashcompinit && bashcompinit",
        bash(parser),
    ])


SHELLS = {"bash": bash, "zsh": zsh}
