"""A stand-in for train.py whose val_bpb is a known function of its size and of one change.

For the tests of `autoloop ladder` (tests/test_ladder.py): no torch, no training, the result
file and summary block as train.py writes them, at once (the budget is not slept).

  * the size: N = 12·DEPTH·WIDTH² parameters, trained on D = 20·N tokens, compute C = 6·N·D;
    c = log10(C / C at DEPTH 2, WIDTH 64), the night's size;
  * the true value: 3.0 − 0.3·c, less Δ(c) while TRICK is 1, Δ set by KIND:
      holds  0.05 at every size;
      shrink 0.2·(C/C0)^-0.05, a power law that fades;
      flip   0.04 − 0.04·c, helps small models, hurts from c = 1 on;
      noise  0;
    plus 0.1·log2(LR / LR*)², where the best rate LR* = 0.02·(N/N0)^-0.5 moves with size;
  * or, for the kinds read in compute multipliers, a loss with a floor, 1 + 10^(−c/2) (a power
    law in compute with an irreducible 1), no learning-rate term, and the change worth
      fraction  a constant 10 % of the reducible loss: the same ×1.23 compute at every size,
                while its Δ halves with every decade of compute;
      fading    a compute multiplier of 10^(0.1 − 0.05·c): ×1.26 at the night's size, ×1 at c = 2;
  * the noise: SIGMA × a standard normal drawn from the seed and the constants; for the two
    kinds above drawn without TRICK, the same on both sides of a pair (noiseless paired seeds).
"""

import json
import math
import os
import random

# The constants sit apart, so that a change of one reverts without touching the others.

DEPTH = 2         # layers

WIDTH = 64        # model dimension

TRICK = 0         # the change: 1 switches Δ on

KIND = "holds"    # how Δ behaves with size

LR = 0.02         # the learning rate: best at 0.02 at the night's size, lower for larger models

SIGMA = 0.002     # the run-to-run noise

N0 = 12 * 2 * 64 ** 2
TRUE_EXPONENT = -0.5   # of LR* against N


def compute(depth, width):
    n = 12 * depth * width ** 2
    return n, 20 * n, 6 * n * 20 * n


def delta(kind, c):
    return {"holds": 0.05, "shrink": 0.2 * 10 ** (-0.05 * c), "flip": 0.04 - 0.04 * c, "noise": 0.0}[kind]


FLOOR_KINDS = ("fraction", "fading")


def floor_curve(c, multiplier_log10=0.0):
    """The loss at c with a compute multiplier: the parent's loss at c + log10(multiplier)."""
    return 1.0 + 10 ** (-0.5 * (c + multiplier_log10))


def true_value(depth, width, trick, kind, lr):
    n, _, big_c = compute(depth, width)
    c = math.log10(big_c / compute(2, 64)[2])
    if kind in FLOOR_KINDS:
        if not trick:
            return floor_curve(c)
        if kind == "fraction":
            return 1.0 + 0.9 * 10 ** (-0.5 * c)
        return floor_curve(c, 0.1 - 0.05 * c)
    best_lr = 0.02 * (n / N0) ** TRUE_EXPONENT
    return 3.0 - 0.3 * c - (delta(kind, c) if trick else 0.0) + 0.1 * math.log2(lr / best_lr) ** 2


def noise(seed, depth, width, trick, kind, lr):
    constants = (depth, width, kind, lr) if kind in FLOOR_KINDS else (depth, width, trick, kind, lr)
    return SIGMA * random.Random(":".join(str(v) for v in (seed, *constants))).gauss(0.0, 1.0)


def main():
    seed = int(os.environ.get("AUTOLOOP_SEED", "42"))
    print(f"budget: {os.environ.get('AUTOLOOP_BUDGET_S')} s (not slept: the value is known)", flush=True)
    val_bpb = true_value(DEPTH, WIDTH, TRICK, KIND, LR) + noise(seed, DEPTH, WIDTH, TRICK, KIND, LR)
    n, d, _ = compute(DEPTH, WIDTH)
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
    print(f"total_tokens_M:   {d / 1e6:.6f}")
    print(f"num_params_M:     {n / 1e6:.6f}")
    print("num_steps:        1", flush=True)


if __name__ == "__main__":
    main()
