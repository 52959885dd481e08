#!/usr/bin/env python3
"""Starts two children, writes the three pids to argv[1], then sleeps: an agent still
thinking when the orchestrator is killed. One child stays in the agent's session with an
empty environment (only the session finds it), the other leaves for a session of its own
(only the token in its environment finds it). With `switch BRANCH` it first checks out a
new branch, sets X = 0.5 in train.py and commits there."""

import os
import subprocess
import sys
import time
from pathlib import Path

if sys.argv[2:3] == ["switch"]:
    subprocess.run(["git", "checkout", "-q", "-b", sys.argv[3]], check=True)
    train = Path("train.py")
    train.write_text(train.read_text().replace("X = 1.0", "X = 0.5"))
    subprocess.run(["git", "commit", "-q", "-a", "-m", "agent's own commit"], check=True)

sleep = [sys.executable, "-c", "import time; time.sleep(3600)"]
same_session = subprocess.Popen(sleep, env={})
own_session = subprocess.Popen(sleep, start_new_session=True)
Path(sys.argv[1]).write_text(f"{os.getpid()} {same_session.pid} {own_session.pid}\n")
print("fake agent: thinking", flush=True)
time.sleep(3600)
