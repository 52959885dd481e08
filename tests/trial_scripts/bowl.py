"""A train.py stand-in for search tests: val_bpb is a known bowl over its constants, no noise.

Copied into a test repository as train.py and run with --command. The minimum (1.0) is at
OPT; the constants' kinds cover the search space's (float, momentum-like, power of two,
int, fraction). With BOWL_CRASH_ABOVE=X set, a LR above X "diverges" like a NaN loss.
"""
import math
import os

LR = 0.3            # log-uniform float; best 0.08
MOMENTUM = 0.9      # distance to 1; best 0.95
WIDTH = 64          # power of two; best 128
N_HEADS = 4         # divides WIDTH
DEPTH = 3           # int; best 4
WARMDOWN_FRAC = 0.4 # fraction; best 0.5

OPT = {"LR": 0.08, "MOMENTUM": 0.95, "WIDTH": 128, "DEPTH": 4, "WARMDOWN_FRAC": 0.5}


def main():
    crash_above = os.environ.get("BOWL_CRASH_ABOVE")
    print("step 00001 | loss: 2.0000", flush=True)
    if crash_above and LR > float(crash_above):
        print("FAIL: loss is nan at step 2", flush=True)
        raise SystemExit(1)
    assert WIDTH % N_HEADS == 0, "WIDTH must be divisible by N_HEADS"
    value = 1.0
    for name, best in OPT.items():
        v = globals()[name]
        x = math.log((1 - v) / (1 - best)) if name == "MOMENTUM" else math.log(v / best)
        value += 0.1 * x * x
    print("---")
    print(f"val_bpb:          {value:.6f}")


if __name__ == "__main__":
    main()
