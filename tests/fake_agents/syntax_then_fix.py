#!/usr/bin/env python3
"""First call: restores the learning rates but leaves a syntax error. Handed the fix
request (the prompt has a '## Fix request' section), it removes the broken line."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, set_constants, values_from

BROKEN = "def broken(:\n"
prompt = Path(sys.argv[1]).read_text()
train = Path("train.py")
if "## Fix request" in prompt:
    assert "SyntaxError" in prompt, "the fix request should carry the crash reason"
    train.write_text(train.read_text().replace(BROKEN, ""))
    describe("restore learning rates (syntax error fixed)")
    print("fake agent: fixed the syntax error")
else:
    set_constants(train, values_from(sys.argv[2:]))
    train.write_text(train.read_text() + BROKEN)
    describe("restore learning rates")
    print("fake agent: raised the learning rates (and left a typo)")
