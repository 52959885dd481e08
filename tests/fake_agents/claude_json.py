#!/usr/bin/env python3
"""Prints its result the way `claude -p --output-format json` does (one JSON object with
total_cost_usd and usage; the cost per call is argv[1] dollars), after raising the
constants NAME=VALUE given a little more each trial (never the same change twice)."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _edit import describe, scale_constants, values_from

trial = int(os.environ["AUTOLOOP_TRIAL"])
prompt = sys.stdin.read()
scale_constants(Path("train.py"), values_from(sys.argv[2:]), 1 + trial / 10)
describe(f"learning rates x{1 + trial / 10}")
print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "duration_ms": 5230, "num_turns": 3,
                  "result": "Raised the learning rates.", "session_id": "fake", "total_cost_usd": float(sys.argv[1]),
                  "usage": {"input_tokens": len(prompt) // 4, "cache_creation_input_tokens": 1000,
                            "cache_read_input_tokens": 5000, "output_tokens": 200}}))
