#!/usr/bin/env python3
"""Sets the constants given as NAME=VALUE, commits, force-moves branch `main` and tag `v1`
onto its commit, then SIGKILLs its parent (the orchestrator): a kill -9 in the middle of
an agent call that had moved refs. `--resume` must put `main` and `v1` back."""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, set_constants, values_from
from _git import git

set_constants(Path("train.py"), values_from(sys.argv[1:]))
describe("moved refs, then the orchestrator died")
git("commit", "-q", "-a", "-m", "agent's own commit")
git("branch", "-f", "main", "HEAD")
git("tag", "-f", "v1", "HEAD")
os.kill(os.getppid(), signal.SIGKILL)
