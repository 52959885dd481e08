"""Prints a summary block and/or writes a result file, as told by its arguments:

    report_metric.py RESULT STDOUT [NONCE]

RESULT: a number for the result file, "garbage" for invalid JSON, "evaluate" to write it
with autoloop.evaluate itself (value 1.25), "-" for none. STDOUT: the text after
"val_bpb:" in the summary block, "-" for no summary. NONCE overrides the env's nonce.
"""
import json
import os
import sys

result, stdout = sys.argv[1], sys.argv[2]
nonce = sys.argv[3] if len(sys.argv) > 3 else os.environ.get("AUTOLOOP_NONCE")
path = os.environ.get("AUTOLOOP_RESULT")
if result == "evaluate":
    from autoloop.evaluate import write_result_file

    write_result_file(1.25, 16384, "test-fingerprint", 0.5)
elif result == "garbage":
    with open(path, "w") as f:
        f.write("{not json")
elif result != "-":
    value = float(result)
    with open(path, "w") as f:
        json.dump({"metric": "val_bpb", "value": value, "val_bpb": value, "eval_bytes": 16384,
                   "fingerprint": "test-fingerprint", "eval_seconds": 0.5, "nonce": nonce}, f)
print("step 00100 (100.0%) | loss: 1.0000")
if stdout != "-":
    print("---")
    print(f"val_bpb:          {stdout}")
    print("training_seconds: 2.0")
    print("peak_vram_mb:     123.4")
    print("num_steps:        100")
