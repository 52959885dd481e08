#!/usr/bin/env python3
"""Restores the learning rates, and also writes a file besides train.py (not allowed)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, set_constants, values_from

set_constants(Path("train.py"), values_from(sys.argv[1:]))
Path("helper.py").write_text("# a helper the agent should not have written\n")
describe("restore learning rates")
