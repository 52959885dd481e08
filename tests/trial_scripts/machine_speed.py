"""A train.py stand-in whose val_bpb depends on the machine's speed (tests/test_machine_speed.py).

Like the real train.py under a wall-clock budget, it "manages" more steps on a faster
machine and by a change that trains faster: steps = 300 x machine x SPEEDUP, where machine
is the factor the probe applied to this run (AUTOLOOP_PROBE_SCALE, passed on by the test
knob of autoloop.execution.machine_speed), and val_bpb = 2 - 0.1 x ln(steps) plus a small
noise drawn from the seed. SPEEDUP is the real change a test makes; LABEL changes nothing.
"""
import math
import os
import random

SPEEDUP = 1.0   # a change that truly trains faster: more steps in the same budget
LABEL = 0       # a change that changes nothing


def main():
    machine = float(os.environ.get("AUTOLOOP_PROBE_SCALE", "1"))
    steps = 300 * machine * SPEEDUP
    noise = random.Random(int(os.environ.get("AUTOLOOP_SEED", "42"))).gauss(0.0, 0.002)
    print("---")
    print(f"val_bpb:          {2.0 - 0.1 * math.log(steps) + noise:.6f}")
    print(f"num_steps:        {steps:.0f}")


if __name__ == "__main__":
    main()
