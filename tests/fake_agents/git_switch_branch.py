#!/usr/bin/env python3
"""Checks out branch argv[1] (created when it does not exist), sets the constants given as
NAME=VALUE and commits there; with the argument `fail` it then exits 2."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, set_constants, values_from
from _git import git

branch = sys.argv[1]
exists = git("branch", "--list", branch)
git("checkout", "-q", *([branch] if exists else ["-b", branch]))
set_constants(Path("train.py"), values_from(sys.argv[2:]))
git("commit", "-q", "-a", "-m", "work on my own branch")
describe("edit on another branch")
if "fail" in sys.argv[2:]:
    print("fake agent: giving up")
    sys.exit(2)
