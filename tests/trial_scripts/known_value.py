"""A stand-in for train.py whose true val_bpb is a known function of its constants, plus noise.

For the tests of `autoloop verify` (tests/test_verify.py): no torch, no training, the
result file and summary block as train.py writes them, at once (the budget is not slept).

  * the true value: 3.0, less 0.2 while LR is 0.02 (the best rate; 0 at 0.01 or below),
    and that gain fades with depth: whole at DEPTH 2, gone from DEPTH 6 on;
    WARMUP, and SALT, change nothing;
  * the noise: SIGMA x a standard normal drawn from the seed and the constants (other code,
    another random stream, as with a real model); so a change that does nothing can still
    look better on one seed ("a rider"), never on average.
"""

import json
import math
import os
import random

# The constants sit apart, so that a change of one reverts without touching the others.

LR = 0.01         # the learning rate: 0.02 is the best

# The model's size.
DEPTH = 2         # layers: the LR's gain fades from 2 to 6

# The schedule.
WARMUP = 10       # warm-up steps: no effect on the true value

# The measurement.
SIGMA = 0.003     # the run-to-run noise


def true_value(lr, depth):
    gain = 0.2 * min(1.0, max(0.0, math.log2(lr / 0.01))) if lr > 0 else 0.0
    return 3.0 - gain * min(1.0, max(0.0, (6 - depth) / 4))


def noise(seed, lr, depth, warmup):
    return SIGMA * random.Random(f"{seed}:{lr}:{depth}:{warmup}").gauss(0.0, 1.0)


def main():
    seed = int(os.environ.get("AUTOLOOP_SEED", "42"))
    print(f"budget: {os.environ.get('AUTOLOOP_BUDGET_S')} s (not slept: the value is known)", flush=True)
    val_bpb = true_value(LR, DEPTH) + noise(seed, LR, DEPTH, WARMUP)
    target = os.environ.get("AUTOLOOP_RESULT")
    if target:
        record = {"metric": "val_bpb", "value": val_bpb, "val_bpb": val_bpb,
                  "nonce": os.environ.get("AUTOLOOP_NONCE")}
        with open(target + ".tmp", "w") as f:
            f.write(json.dumps(record) + "\n")
        os.replace(target + ".tmp", target)
    print("---")
    print(f"val_bpb:          {val_bpb:.6f}")
    print("training_seconds: 0.1")
    print("total_seconds:    0.1")
    print("peak_vram_mb:     1.0")
    print("num_steps:        1", flush=True)


if __name__ == "__main__":
    main()
