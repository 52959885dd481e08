#!/usr/bin/env python3
"""Sets the constants given as NAME=VALUE and amends them into the kept commit at HEAD."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, set_constants, values_from
from _git import git

set_constants(Path("train.py"), values_from(sys.argv[1:]))
git("commit", "-q", "-a", "--amend", "-m", "amended by the fake agent")
describe("amended edit")
