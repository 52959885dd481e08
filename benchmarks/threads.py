"""How should train.py use the CPU's threads? Training speed of the default train.py under each setting.

torch's OpenMP workers spin for a while (libgomp: 300,000 spins) before they sleep while
they wait for work. On an idle machine that saves a wake-up; on a machine whose cores other
jobs share, the spinning worker takes the core the one with work waits for. train.py
therefore sets OMP_WAIT_POLICY=PASSIVE unless the environment sets a policy. This trains
train.py for --budget seconds under each setting, interleaved (spin, passive, one thread,
spin, ...), and prints steps/s per run (the same model and batch throughout, so steps/s is
tokens/s up to a constant) and the median per setting, relative to spin:

    spin     all cores, libgomp's default spinning (what torch does by default)
    passive  all cores, OMP_WAIT_POLICY=PASSIVE (train.py's default)
    1 thread OMP_NUM_THREADS=1

    python benchmarks/threads.py                  # 3 rounds of 30 s
    python benchmarks/threads.py --rounds 5 --budget 20

Compare it on an idle machine and under load (e.g. beside `python -m pytest`): the load
during the run is printed with it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from bpb import run_train  # noqa: E402

sys.path.insert(0, str(REPO))
from autoloop.data import default_data_dir, load_data  # noqa: E402

# libgomp's spin count when no policy is set; with PASSIVE it would be 0. Setting it with
# PASSIVE restores the default behaviour (train.py only fills in the policy).
SETTINGS = {
    "spin": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "300000"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "1 thread": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=30.0, help="training seconds per run (default 30)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per setting (default 3)")
    parser.add_argument("--train", type=Path, default=REPO / "train.py", help="the train.py to run")
    args = parser.parse_args()
    if args.budget <= 0 or args.rounds < 1:
        parser.error("--budget must be positive and --rounds at least 1")
    if not args.train.is_file():
        parser.error(f"no such file: {args.train}")

    load_data()
    data_dir = Path(os.environ.get("AUTOLOOP_DATA_DIR") or default_data_dir())
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {args.rounds} rounds of "
          f"{args.budget:g} s per setting, interleaved\n")
    print(f"{'round':>5}  {'setting':<9} {'steps/s':>8} {'steps':>6} {'load':>5}", flush=True)
    speeds: dict[str, list[float]] = {name: [] for name in SETTINGS}
    saved = {k: os.environ.get(k) for env in SETTINGS.values() for k in env}
    try:
        for r in range(1, args.rounds + 1):
            for name, env in SETTINGS.items():
                for k in saved:
                    os.environ.pop(k, None)
                os.environ.update(env)
                s = run_train(args.train.resolve(), args.budget, 42, data_dir, "cpu")
                if "error" in s:
                    print(f"{r:>5}  {name:<9} FAILED: {s['error']}")
                    return 1
                # The first step is not timed (warm-up), so it is not counted either.
                rate = (s["num_steps"] - 1) / max(s["training_seconds"], 1e-9)
                speeds[name].append(rate)
                print(f"{r:>5}  {name:<9} {rate:>8.2f} {s['num_steps']:>6.0f} {os.getloadavg()[0]:>5.2f}", flush=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    base = statistics.median(speeds["spin"])
    print(f"\n{'setting':<9} {'median steps/s':>14} {'min':>6} {'max':>6} {'vs spin':>8}")
    for name, values in speeds.items():
        print(f"{name:<9} {statistics.median(values):>14.2f} {min(values):>6.2f} {max(values):>6.2f} "
              f"{statistics.median(values) / base:>7.2f}x")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
