"""What users type and read stays put: every command's --help, byte for byte.

The package moved its modules into layers without changing the command line; this holds
it there. A deliberate change to a flag or its help regenerates the files:
    python tests/test_cli_surface.py
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden" / "help"
COMMANDS = ["", "prepare", "run", "trial", "verify", "ladder", "doctor", "status", "report", "note", "finalize",
            "dashboard", "watch", "init", "attempts", "mcp"]


def help_text(command: str) -> str:
    """`autoloop COMMAND --help` at a fixed width (argparse wraps to $COLUMNS), printed by
    the parser the console script builds."""
    from autoloop.cli.main import build_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            build_parser().parse_args([*([command] if command else []), "--help"])
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return out.getvalue()


def golden_path(command: str) -> Path:
    return GOLDEN / f"{command or 'autoloop'}.txt"


@pytest.mark.parametrize("command", COMMANDS)
def test_help_text_is_unchanged(command):
    expected = golden_path(command).read_text()
    assert help_text(command) == expected, (
        f"`autoloop {command} --help` changed; if that is meant, run: python tests/test_cli_surface.py")


if __name__ == "__main__":
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name in COMMANDS:
        golden_path(name).write_text(help_text(name))
    print(f"wrote {len(COMMANDS)} files under {GOLDEN}")
