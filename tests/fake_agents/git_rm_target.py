#!/usr/bin/env python3
"""`git rm train.py`; with the argument `commit`, commits the deletion too."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe
from _git import git

git("rm", "-q", "train.py")
if "commit" in sys.argv[1:]:
    git("commit", "-q", "-m", "remove train.py")
describe("start from scratch")
