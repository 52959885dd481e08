#!/usr/bin/env python3
"""Edits train.py by a script of one edit per trial: `scripted.py PROMPT_FILE [--sleep S]
N:EDIT ...`, EDIT being NAME=VALUE[,NAME=VALUE...] and optionally `+typo` (the sum in the
tests' tiny train.py misspelt: a NameError, a trivial crash). Handed a fix request, it
mends the typo. It reads its trial number from the prompt, as an agent reads its task, and
sleeps S seconds first (an agent thinking) when asked to. For tests/test_lookahead.py and
benchmarks/pipeline.py."""

import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, set_constants

TYPO = ("A + B", "A + C")   # tests/test_lookahead.py's train.py prints A + B

args = sys.argv[2:]
prompt = Path(sys.argv[1]).read_text()
if args[:1] == ["--sleep"]:
    time.sleep(float(args[1]))
    args = args[2:]
trial = int(re.search(r"^# This call: trial (\d+)", prompt, re.M).group(1))
train = Path("train.py")
if "## Fix request" in prompt:
    train.write_text(train.read_text().replace(TYPO[1], TYPO[0]))
    describe(f"trial {trial} (typo fixed)")
    sys.exit(0)
edits = dict(arg.split(":", 1) for arg in args)
edit = edits.get(str(trial))
if edit is None:
    print(f"scripted agent: nothing scripted for trial {trial}")
    sys.exit(3)
edit, _, typo = edit.partition("+")
set_constants(train, dict(pair.split("=", 1) for pair in edit.split(",")))
if typo:
    train.write_text(train.read_text().replace(*TYPO))
describe(f"trial {trial}: {edit}" + (" (with a typo)" if typo else ""))
print(f"scripted agent: trial {trial}: {edit}")
