#!/usr/bin/env python3
"""Sets the learning rates given as NAME=VALUE arguments (a clear improvement over the
tests' tiny ones) and describes the change."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, set_constants, values_from

prompt = sys.stdin.read()
print(f"fake agent: read a prompt of {len(prompt)} characters; raising the learning rates")
set_constants(Path("train.py"), values_from(sys.argv[1:]))
describe("restore learning rates")
