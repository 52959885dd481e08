"""Shared by the stand-in CLIs: record how they were called, edit train.py like an agent.

Each stand-in (claude, codex, gemini, aider) answers --version and its own status command
as the real CLI does, and fails the way the real CLI was seen to fail (see presets.py's
docstring). When nothing stops it, it makes the change an agent would: the constants in
$FAKE_CLI_EDIT ("MATRIX_LR=0.04 EMBED_LR=0.6") set in train.py of its working folder,
its one-line description written to $AUTOLOOP_DESCRIPTION_FILE (when the CLI's own rules
let it write there: see may_write). $FAKE_CLI_OFFLINE=1 makes it act as it does without a
network. $FAKE_CLI_RECORD names a file that gets one JSON line per call (argv, cwd and
the variables the test asks about). Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

WATCHED_ENV = ("DISABLE_AUTOUPDATER", "IS_SANDBOX", "AUTOLOOP_TRIAL", "AUTOLOOP_DESCRIPTION_FILE")


def record(name: str) -> None:
    path = os.environ.get("FAKE_CLI_RECORD")
    if path:
        entry = {"cli": name, "argv": sys.argv[1:], "cwd": os.getcwd(),
                 "env": {k: os.environ[k] for k in WATCHED_ENV if k in os.environ}}
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def say(*lines: str, err: bool = False, pause: float = 0.0) -> None:
    stream = sys.stderr if err else sys.stdout
    for line in lines:
        print(line, file=stream, flush=True)
        if pause:
            time.sleep(pause)


def offline() -> bool:
    return os.environ.get("FAKE_CLI_OFFLINE") == "1"


def flag_values(flag: str) -> list[str]:
    args, found = sys.argv[1:], []
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            found.append(args[i + 1])
        elif arg.startswith(flag + "="):
            found.append(arg.split("=", 1)[1])
    return found


def may_write(path: Path, allowed: list[Path]) -> bool:
    """Whether a CLI whose file tools (or sandbox) allow only these folders may write path."""
    path = path.resolve()
    return any(path == a.resolve() or a.resolve() in path.parents for a in allowed)


def edit(description: str, allowed: list[Path] | None = None) -> None:
    """The agent's change: the constants of $FAKE_CLI_EDIT, then the description."""
    target = Path("train.py")
    text = target.read_text()
    for pair in os.environ.get("FAKE_CLI_EDIT", "").split():
        name, value = pair.split("=", 1)
        text, n = re.subn(rf"^{name} = [^#\n]*", f"{name} = {value} ", text, count=1, flags=re.M)
        assert n == 1, name
    target.write_text(text)
    say(f"edited train.py: {os.environ.get('FAKE_CLI_EDIT', '')}")
    out = Path(os.environ["AUTOLOOP_DESCRIPTION_FILE"])
    if allowed is not None and not may_write(out, allowed):
        say(f"Error: Path not in workspace: {out}")
        return
    out.write_text(description + "\n")


def read_prompt() -> str:
    return sys.stdin.read()
