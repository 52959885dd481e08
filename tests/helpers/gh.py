"""A stand-in for the GitHub CLI: `gh` on PATH that records each command line (and the text
of a --body-file) as a JSON line, answers `auth status` (logged out when GH_LOGGED_OUT is
set) and prints a pull request's URL for `pr create`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

STAND_IN = '''#!{python}
"""A stand-in gh: records its command line and the body file's text; logged in unless told."""
import json, os, sys
args = sys.argv[1:]
record = {{"argv": args}}
if "--body-file" in args:
    record["body"] = open(args[args.index("--body-file") + 1]).read()
with open(os.environ["GH_LOG"], "a") as f:
    f.write(json.dumps(record) + "\\n")
if args[:2] == ["auth", "status"] and os.environ.get("GH_LOGGED_OUT"):
    print("You are not logged into any GitHub hosts. To log in, run: gh auth login", file=sys.stderr)
    sys.exit(1)
if args[:2] == ["pr", "create"]:
    print("https://github.com/someone/experiment/pull/7")
'''


def without_gh() -> str:
    """PATH without any folder that holds a real gh."""
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "gh").exists())


def stand_in_gh(tmp: Path) -> tuple[dict[str, str], Path]:
    """(the environment that puts the stand-in first on PATH, the file its calls go to)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    gh = bin_dir / "gh"
    gh.write_text(STAND_IN.format(python=sys.executable))
    gh.chmod(0o755)
    log = tmp / "gh.jsonl"
    return {"PATH": f"{bin_dir}{os.pathsep}{without_gh()}", "GH_LOG": str(log)}, log
