"""A train.py stand-in with a loss curve (tests/test_prune.py): it prints train.py's progress
lines, ``step N (P%) | loss: L``, over its budget (sleeping between them) and reports val_bpb
as train.py does. Its curve is set by constants, so a test chooses how a change trains:

  * loss(p) = END + (START - END) * (1 - p)^2 + LAG * (1 - p)^2 + BEHIND * (1 - p / 2),
    p the share of the budget done; val_bpb = END (the seed moves it by under 0.0001);
  * LAG: behind early and mid-run, gone at the end: a longer warmup, as the real train.py's
    WARMUP_FRAC 0.02 -> 0.25 trained on this machine (benchmarks/data/prune_curves.json:
    0.26 nats behind at 30 % of the budget, 0.11 at 50 %, 0.04 at 70 %, 0.01 at 90 %);
  * BEHIND: behind the whole way, by half as much at the end (a change that loses);
  * STEP_COST: each step takes this many times as long (a wider model): the curve is walked
    by steps, so in the same budget the run gets only so far along it (q = p / STEP_COST),
    level with the best at the same step, behind at the same time, worse at the end;
  * the machine probe's test knob (AUTOLOOP_PROBE_SCALE, passed to the run as its factor): a
    machine that much slower, fewer steps in the same budget as with STEP_COST.

The progress lines carry the step (1000 for the best's whole budget), as train.py's do.
"""

import json
import os
import time

END = 2.0               # the loss at the end, and val_bpb
START = 4.0             # the loss at the start
LAG = 0.0               # behind early and mid-run, gone at the end
BEHIND = 0.0            # an offset the whole way (half of it left at the end, added to val_bpb)
STEP_COST = 1.0         # how many times as long each step takes
LINES = 20              # progress lines over the budget

BUDGET_S = float(os.environ.get("AUTOLOOP_BUDGET_S", "300"))
SEED = int(os.environ.get("AUTOLOOP_SEED", "42"))
MACHINE = float(os.environ.get("AUTOLOOP_PROBE_SCALE", "1.0"))   # the probe's knob: this run's machine
RATE = MACHINE / STEP_COST   # steps per second against the best's


def loss(q):
    """The loss at q, the share of the best's steps done."""
    return END + (START - END + LAG) * (1 - q) ** 2 + BEHIND * (1 - q / 2)


def main():
    for i in range(1, LINES + 1):
        time.sleep(BUDGET_S / LINES)
        p = i / LINES
        q = min(1.0, p * RATE)
        print(f"step {round(1000 * q):05d} ({100 * p:.1f}%) | loss: {loss(q):.4f} | remaining: {BUDGET_S * (1 - p):.0f}s",
              flush=True)
    val_bpb = loss(min(1.0, RATE)) + 0.0001 * ((SEED * 7919) % 97) / 97
    target = os.environ.get("AUTOLOOP_RESULT")
    if target:
        record = {"metric": "val_bpb", "value": val_bpb, "val_bpb": val_bpb,
                  "nonce": os.environ.get("AUTOLOOP_NONCE"), "written_at": time.time()}
        with open(target + ".tmp", "w") as f:
            f.write(json.dumps(record) + "\n")
        os.replace(target + ".tmp", target)
    print("---")
    print(f"val_bpb:          {val_bpb:.6f}")
    print(f"training_seconds: {BUDGET_S:.1f}", flush=True)


if __name__ == "__main__":
    main()
