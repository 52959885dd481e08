#!/usr/bin/env python3
"""Sets the constants given as NAME=VALUE and commits that, then a second commit on top;
writes no description file (its commit messages are all it says)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import set_constants, values_from
from _git import git

values = values_from(sys.argv[1:])
set_constants(Path("train.py"), values)
git("commit", "-q", "-a", "-m", "set " + " ".join(f"{k}={v}" for k, v in values.items()))
with open("train.py", "a") as f:
    f.write("# tuned by the fake agent\n")
git("commit", "-q", "-a", "-m", "explain the change")
