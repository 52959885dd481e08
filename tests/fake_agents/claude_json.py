#!/usr/bin/env python3
"""Prints its result the way `claude -p --output-format json` does (one JSON object with
total_cost_usd and usage; the cost per call is argv[1] dollars), after raising the
constants NAME=VALUE given a little more each trial (never the same change twice)."""

import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, values_from  # noqa: E402

trial = int(os.environ["AUTOLOOP_TRIAL"])
prompt = sys.stdin.read()
text = Path("train.py").read_text()
for name, value in values_from(sys.argv[2:]).items():
    text, n = re.subn(rf"^{name} = [^#\n]*", f"{name} = {float(value) * (1 + trial / 10)} ", text, count=1, flags=re.M)
    assert n == 1, name
Path("train.py").write_text(text)
describe(f"learning rates x{1 + trial / 10}")
print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "duration_ms": 5230, "num_turns": 3,
                  "result": "Raised the learning rates.", "session_id": "fake", "total_cost_usd": float(sys.argv[1]),
                  "usage": {"input_tokens": len(prompt) // 4, "cache_creation_input_tokens": 1000,
                            "cache_read_input_tokens": 5000, "output_tokens": 200}}))
