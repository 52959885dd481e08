#!/usr/bin/env python3
"""`git reset --hard HEAD~1` (throwing away the kept commit at HEAD), then sets the
constants given as NAME=VALUE."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, set_constants, values_from
from _git import git

git("reset", "-q", "--hard", "HEAD~1")
set_constants(Path("train.py"), values_from(sys.argv[1:]))
describe("edit after a reset")
