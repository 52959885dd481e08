#!/usr/bin/env python3
"""Stages a draft of train.py, then sets the constants given as NAME=VALUE without staging
them (train.py half-staged); also stages a notes file, then edits it again."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, set_constants, values_from
from _git import git

train = Path("train.py")
train.write_text(train.read_text() + "# draft\n")
Path("notes.txt").write_text("first notes\n")
git("add", "train.py", "notes.txt")
set_constants(train, values_from(sys.argv[1:]))
Path("notes.txt").write_text("first notes\nsecond thoughts\n")
describe("half-staged edit")
