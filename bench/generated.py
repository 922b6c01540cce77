"""A part of BENCHMARKS.md written by a command, not by hand (the Scaling section, the
sinks plan table): rewrite it from what the code computes, or say whether it is current
(``--check``, exit 1 when it is not)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"


@dataclass(frozen=True)
class Generated:
    what: str  # as the check's sentence names it: "Scaling section"
    module: str  # the command that writes it: python -m <module>
    build: Callable[[], str]  # what the part should hold
    current: Callable[[str], str]  # the part as the file holds it
    replace: Callable[[str, str], str]  # the file's text with the part replaced

    def write(self, path: Path = BENCHMARKS_MD) -> bool:
        """Rewrite the part; True when it changed."""
        text = path.read_text()
        new = self.replace(text, self.build())
        if new != text:
            path.write_text(new)
        return new != text

    def main(self, argv: Sequence[str] | None, description: str, path: Path = BENCHMARKS_MD) -> int:
        p = argparse.ArgumentParser(prog=f"python -m {self.module}", description=description)
        p.add_argument("--check", action="store_true", help=f"only say whether BENCHMARKS.md's {self.what} is current")
        args = p.parse_args(argv)
        if args.check:
            ok = self.current(path.read_text()) == self.build()
            print(f"BENCHMARKS.md's {self.what} is " + ("current" if ok else f"out of date: run python -m {self.module}"))
            return 0 if ok else 1
        print("rewritten" if self.write(path) else "already current")
        return 0
