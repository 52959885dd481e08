#!/usr/bin/env python3
"""Copies what it was given (stdin, the {prompt_file} argument, its environment) into the
folder argv[2], then appends a comment to train.py without writing a description."""

import json
import os
import sys
from pathlib import Path

out = Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
(out / "stdin.txt").write_text(sys.stdin.read())
(out / "prompt_file.txt").write_text(sys.argv[1])
(out / "env.json").write_text(json.dumps({k: v for k, v in os.environ.items() if k.startswith("AUTOLOOP_")}))
(out / "cwd.txt").write_text(os.getcwd())
with open("train.py", "a") as f:
    f.write("# touched by the fake agent\n")
print("fake agent: recorded the prompt")
