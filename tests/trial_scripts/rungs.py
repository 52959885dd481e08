"""A train.py stand-in with two rungs (tests/test_scout.py): what it reports at the scout
budget and at the full one is set apart by two constants, so a test chooses how the rungs
agree. No training, no sleep: a run costs its start-up only.

  * a budget under FULL_AT_S seconds (--scout) reports SCOUT_BPB, a longer one FULL_BPB;
  * the seed moves the result by under 0.001: the noise the scout samples of the best see.
"""

import json
import os
import time

SCOUT_BPB = 5.0         # val_bpb after a scout run
FULL_BPB = 5.0          # val_bpb after a full-budget run
FULL_AT_S = 1.5         # a budget at least this long is the full rung

BUDGET_S = float(os.environ.get("AUTOLOOP_BUDGET_S", "300"))
SEED = int(os.environ.get("AUTOLOOP_SEED", "42"))


def main():
    val_bpb = (FULL_BPB if BUDGET_S >= FULL_AT_S else SCOUT_BPB) + 0.001 * ((SEED * 7919) % 97) / 97
    print("step 00001 | loss: 3.0000", flush=True)
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
