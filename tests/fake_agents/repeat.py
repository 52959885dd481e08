#!/usr/bin/env python3
"""Makes the same change every time it is called (an agent that forgets): sets the
NAME=VALUE constants given, on even trials spelt differently (extra spaces, a comment, an
equal number written otherwise), so that only a gate ignoring all that sees the repeat.
Copies each prompt it gets to the folder argv[1] as <trial>.md."""

import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, values_from

trial = int(os.environ["AUTOLOOP_TRIAL"])
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
(out / f"{trial}.md").write_text(sys.stdin.read())
target = Path("train.py")
text = target.read_text()
for name, value in values_from(sys.argv[2:]).items():
    if trial % 2 == 0:   # the same value, written otherwise: 0.5 -> 5e-1, with a comment
        value = f"{float(value):e}  # again, with feeling"
    text, n = re.subn(rf"^{name} = [^#\n]*", f"{name} =   {value} ", text, count=1, flags=re.M)
    assert n == 1, name
target.write_text(text)
describe("freeze the head (" + ("spelt again" if trial % 2 == 0 else "first time") + ")")
print(f"fake agent: trial {trial}, the same change as ever")
