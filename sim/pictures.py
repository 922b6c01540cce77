"""The run's pictures: ``wsfleet report`` written into the run directory once its
report.json is there, so that a demo or chaos run ends with an HTML file to open."""

from __future__ import annotations

from pathlib import Path

from wsfleet.cli import run_report


def write(run_dir: Path) -> str:
    """The sentence to print: where the HTML is, or why it could not be written (the
    run's own verdict stands either way)."""
    try:
        path = run_report.write(run_dir)
    except Exception as exc:  # noqa: BLE001 - a picture that fails must not fail the run
        return f"pictures: not written ({type(exc).__name__}: {exc})"
    return f"pictures (open in a browser, no network needed): {path}"
