#!/usr/bin/env python3
"""Starts a child in its own session and one in the agent's, writes the three pids to
argv[1], then sleeps: an agent still thinking when the orchestrator is killed."""

import os
import subprocess
import sys
import time
from pathlib import Path

sleep = [sys.executable, "-c", "import time; time.sleep(3600)"]
same = subprocess.Popen(sleep)
detached = subprocess.Popen(sleep, start_new_session=True)
Path(sys.argv[1]).write_text(f"{os.getpid()} {same.pid} {detached.pid}\n")
print("fake agent: thinking", flush=True)
time.sleep(3600)
