#!/usr/bin/env python3
"""Restores the learning rates and exits 0, leaving a daemon behind (setsid, double fork)
that would append to train.py two seconds later, while the trial runs. Writes the
daemon's pid to argv[1]; NAME=VALUE arguments follow."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, set_constants, values_from

pid_file = Path(sys.argv[1])
set_constants(Path("train.py"), values_from(sys.argv[2:]))
describe("restore learning rates")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        pid_file.with_suffix(".tmp").write_text(str(os.getpid()))
        os.replace(pid_file.with_suffix(".tmp"), pid_file)
        time.sleep(2)
        with open("train.py", "a") as f:
            f.write("# written by the agent's daemon behind the loop's back\n")
        time.sleep(60)
    os._exit(0)
while not pid_file.exists():
    time.sleep(0.01)
print("fake agent: done (a daemon stays behind)")
