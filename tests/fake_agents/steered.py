#!/usr/bin/env python3
"""An agent whose person talks to it mid-night: copies each prompt to the folder argv[1]
as <trial>.md; on trial 1 it runs `autoloop note "<argv[2]>"` as a separate process (the
person's shell), then sets the NAME=VALUE constants given, scaled a little more each trial, and
writes a description and a two-line hypothesis (its first line is the one kept)."""

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, scale_constants, values_from

trial = int(os.environ["AUTOLOOP_TRIAL"])
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
(out / f"{trial}.md").write_text(sys.stdin.read())
if trial == 1:
    subprocess.run([sys.executable, "-m", "autoloop.cli", "note", sys.argv[2]], check=True)
scale_constants(Path("train.py"), values_from(sys.argv[3:]), 1 + trial / 10)
describe(f"learning rates x{1 + trial / 10}")
Path(os.environ["AUTOLOOP_HYPOTHESIS_FILE"]).write_text(
    "larger   steps learn faster in a short budget\n(a second line, not kept)\n")
print(f"fake agent: trial {trial}")
