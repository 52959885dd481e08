#!/usr/bin/env python3
"""Hangs with a grandchild in a session of its own; writes both pids to argv[1]."""

import os
import subprocess
import sys
import time
from pathlib import Path

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
Path(sys.argv[1]).write_text(f"{os.getpid()} {child.pid}\n")
print("fake agent: thinking very hard", flush=True)
time.sleep(3600)
