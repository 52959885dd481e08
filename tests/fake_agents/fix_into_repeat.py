#!/usr/bin/env python3
"""Sets the NAME=VALUE constants given on every trial (an agent that forgets); on trial 2
its first attempt also breaks train.py with a syntax error, and its fix only removes the
error: the fixed change is then the one trial 1 already made."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, set_constants, values_from

BROKEN = "def broken(:\n"
target = Path("train.py")
if os.environ["AUTOLOOP_ATTEMPT"] != "1":   # the fix request
    target.write_text(target.read_text().replace(BROKEN, ""))
else:
    set_constants(target, values_from(sys.argv[1:]))
    if os.environ["AUTOLOOP_TRIAL"] == "2":
        target.write_text(target.read_text() + BROKEN)
    describe("freeze the head")
print("fake agent: done")
