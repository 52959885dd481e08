"""A scripted stand-in for train.py in tests of the loop: no torch, no model, the same shape.

It has train.py's learning-rate constants, its main function and its learning-rate
schedule, so the edits the tests make to train.py (restore the rates, freeze every weight, a
typo in the schedule, a NaN rate, a spin at the top of main) mean the same here, and it
reports as train.py does: progress lines, the FAIL line, the summary block, the result file
with the run's nonce. "Training" sleeps the budget; val_bpb is a pure function of the rates
(and a little of the seed), so a verdict never depends on how loaded the machine is.

  * each rate learns up to 2 bits per byte, less by |log10(rate / best)|: the defaults
    below reach 2.0, rates 50-100x too small (tests/helpers/loop.py: SLOW) about 7.7;
  * all rates 0 learns nothing: exactly 8.0, a uniform guess over 256 bytes;
  * the seed moves the result by under 0.001: the noise a --noise-runs estimate sees.
"""

import json
import math
import os
import time

MATRIX_LR = 0.02        # the block matrices' rate (train.py's default: the best here)
EMBED_LR = 0.3          # the embedding's rate (train.py's default: the best here)
HEAD_LR = 0.01          # the output head's rate (train.py's default: the best here)
LOG_EVERY_S = 1.0       # seconds between progress lines

BUDGET_S = float(os.environ.get("AUTOLOOP_BUDGET_S", "300"))
SEED = int(os.environ.get("AUTOLOOP_SEED", "42"))
BEST = {"MATRIX_LR": 0.02, "EMBED_LR": 0.3, "HEAD_LR": 0.01}


def lr_multiplier(progress):
    return 1.0 - 0.9 * progress


def fail(message):
    print(f"FAIL: {message}", flush=True)
    raise SystemExit(1)


def learned(rate, best):
    return max(0.0, 2.0 - abs(math.log10(rate / best))) if rate > 0 else 0.0


def main():
    rates = {"MATRIX_LR": MATRIX_LR, "EMBED_LR": EMBED_LR, "HEAD_LR": HEAD_LR}
    if not all(math.isfinite(r) for r in rates.values()):
        fail("loss is nan at step 1")
    val_bpb = 8.0 - sum(learned(rates[name], BEST[name]) for name in BEST)
    if val_bpb < 8.0:
        val_bpb += 0.001 * ((SEED * 7919) % 97) / 97
    t_start = time.time()
    step = 0
    while time.time() - t_start < BUDGET_S:
        progress = (time.time() - t_start) / BUDGET_S
        step += 1
        loss = val_bpb * math.log(2) * (1 + lr_multiplier(progress))
        print(f"step {step:05d} ({100 * min(progress, 1):.1f}%) | loss: {loss:.4f} | "
              f"lrm: {lr_multiplier(progress):.2f} | remaining: {max(0, BUDGET_S - (time.time() - t_start)):.0f}s",
              flush=True)
        time.sleep(min(LOG_EVERY_S, max(0.0, BUDGET_S - (time.time() - t_start))))
    training_time = time.time() - t_start
    target = os.environ.get("AUTOLOOP_RESULT")
    if target:
        record = {"metric": "val_bpb", "value": val_bpb, "val_bpb": val_bpb, "audit_bpb": val_bpb + 0.01,
                  "nonce": os.environ.get("AUTOLOOP_NONCE"), "written_at": time.time()}
        with open(target + ".tmp", "w") as f:
            f.write(json.dumps(record) + "\n")
        os.replace(target + ".tmp", target)
    print("---")
    print(f"val_bpb:          {val_bpb:.6f}")
    print(f"training_seconds: {training_time:.1f}")
    print(f"total_seconds:    {time.time() - t_start:.1f}")
    print(f"peak_vram_mb:     {1.0:.1f}")
    print(f"num_steps:        {step}", flush=True)


if __name__ == "__main__":
    main()
