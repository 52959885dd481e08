#!/usr/bin/env python3
"""Records every prompt it is given, then edits train.py by a script of one move per trial:
`remembering.py PROMPT_FILE RECORD_DIR N:NAME=VALUE ...`. The prompt goes to
RECORD_DIR/prompt-<trial>.txt; the move is described as the mutator would (`NAME old -> new`),
so the digest groups it by constant. For tests/test_study.py: a second night's agent whose
first prompt must name the first night's failed directions."""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, set_constants

prompt = Path(sys.argv[1]).read_text()
record = Path(sys.argv[2])
record.mkdir(parents=True, exist_ok=True)
trial = int(re.search(r"^# This call: trial (\d+)", prompt, re.M).group(1))
(record / f"prompt-{trial}.txt").write_text(prompt)
edit = dict(arg.split(":", 1) for arg in sys.argv[3:]).get(str(trial))
if edit is None:
    print(f"remembering agent: nothing scripted for trial {trial}")
    sys.exit(3)
name, value = edit.split("=", 1)
train = Path("train.py")
old = re.search(rf"^{name} = (\S+)", train.read_text(), re.M).group(1)
set_constants(train, {name: value})
describe(f"{name} {old} -> {value}")
print(f"remembering agent: trial {trial}: {name} {old} -> {value}")
