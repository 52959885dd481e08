"""What share of a step over N ranks goes to communication, before and after? (CPU, gloo)

    python benchmarks/ranks_comm.py [--before main] [--ranks 2] [--steps 30] [--repeats 2]
                                    [--sizes 256,4,16,128] [--profile mps]

Runs two train.py side by side in one run: BEFORE's (`git show <before>:train.py`) and this
checkout's, each for a fixed number of steps (AUTOLOOP_MAX_STEPS) on CPU ranks over gloo, one
thread per rank. For each it times a step two ways:
  * over N ranks at the global batch (the time of a real step);
  * on one rank training one rank's slice alone (batch / N): the same work per rank with
    nothing to send and nobody to wait for, Muon replicated in full.
The share of a step spent communicating is (N-rank step - one-slice step) / N-rank step: the
exposed communication and waiting, net of what splitting Muon over the ranks saves. The
default profile is `mps` on the CPU device: the switches of a GPU profile with no compilation
(a dense bigram gradient, fp32), which is what the all-reduce of a GPU trial carries.

Per run: step time = training_seconds / (num_steps - 1) (step 0 is warm-up, not timed). The
machine's other load moves every figure; the minimum over --repeats is kept.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def step_ms(script: Path, ranks: int, sizes: str, profile: str, steps: int, data_dir: Path) -> float:
    """Milliseconds per timed step of one run of `script`."""
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] if ranks > 1 else []
    env = {**os.environ, "AUTOLOOP_MAX_STEPS": str(steps), "AUTOLOOP_DEVICE": "cpu", "AUTOLOOP_PROFILE": profile,
           "AUTOLOOP_SIZES": sizes, "AUTOLOOP_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    env.pop("AUTOLOOP_RESULT", None)
    proc = subprocess.run([sys.executable, *launcher, script.name], cwd=script.parent, env=env, capture_output=True,
                          text=True, timeout=3600)
    summary = dict(re.findall(r"^(\w+):\s+(\S+)$", proc.stdout, re.M))
    if proc.returncode != 0 or "training_seconds" not in summary:
        sys.exit(f"ranks_comm: {script} over {ranks} rank(s) failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return 1000 * float(summary["training_seconds"]) / max(int(summary["num_steps"]) - 1, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="main", help="the git revision whose train.py is 'before'")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sizes", default="256,4,16,128", help="width,depth,global batch,seq (AUTOLOOP_SIZES)")
    parser.add_argument("--profile", default="mps")
    args = parser.parse_args()
    width, depth, batch, seq = (int(v) for v in args.sizes.split(","))
    if batch % args.ranks:
        sys.exit(f"ranks_comm: a batch of {batch} does not split over {args.ranks} ranks")
    slice_sizes = f"{width},{depth},{batch // args.ranks},{seq}"
    sys.path.insert(0, str(REPO))
    from autoloop.data import CorpusSpec, prepare

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        prepare(CorpusSpec(val_bytes=64 * 1024, audit_bytes=4096), data_dir)
        before = Path(tmp) / "before" / "train.py"
        before.parent.mkdir()
        before.write_text(subprocess.run(["git", "show", f"{args.before}:train.py"], cwd=REPO, check=True,
                                         capture_output=True, text=True).stdout)
        scripts = {f"{args.before} (before)": before, "this checkout": REPO / "train.py"}
        best: dict[tuple[str, int], float] = {}
        for _ in range(args.repeats):   # interleaved, so that a burst of other load hits both alike
            for label, script in scripts.items():
                for ranks, sizes in ((args.ranks, args.sizes), (1, slice_sizes)):
                    ms = step_ms(script, ranks, sizes, args.profile, args.steps, data_dir)
                    best[(label, ranks)] = min(ms, best.get((label, ranks), float("inf")))
    print(f"train.py, profile {args.profile} on the CPU, sizes {args.sizes} (width,depth,batch,seq), "
          f"{args.steps} steps, {args.ranks} gloo ranks of one thread; min of {args.repeats}")
    print(f"{'train.py':<20} {f'step ms, {args.ranks} ranks':>18} {'step ms, 1 slice':>17} {'communicating':>14}")
    for label in scripts:
        n, one = best[(label, args.ranks)], best[(label, 1)]
        print(f"{label:<20} {n:>18.1f} {one:>17.1f} {100 * (n - one) / n:>13.1f}%")


if __name__ == "__main__":
    main()
