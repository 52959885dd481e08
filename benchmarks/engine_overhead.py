"""Seconds of harness + engine overhead per trial, side by side in one run: local trials; a real
(private, one-node) Slurm cluster, one job per trial and one step per trial in a single
allocation; a real Ray cluster (a head and two worker nodes on this machine), one actor per
trial, and one trial over two worker nodes (a placement group, an actor per node, torch's
launcher on each); on a scripted stand-in train.py that sleeps its budget.

    python benchmarks/engine_overhead.py [--trials 4] [--sleep 1] [--engines local,slurm,ray,ray2]

Each row is one night of ``autoloop run --proposer queue`` (a baseline and trials-1 queued
candidates) in a fresh git repo; ``per trial`` = (night wall - trials x sleep) / trials, so it
holds the harness (propose, commit, judge, ledger) and, for Slurm, either sbatch, the
scheduler's start-up, submitit's pickles and the polling (``slurm jobs``), or srun's step
creation inside one allocation (``slurm steps``: the night is ``salloc``'s command, and its
wall includes getting the allocation once), or, for Ray (``ray actors``), joining the cluster,
the probe for a shared filesystem, and per trial an actor's creation, placement, a new worker
process on the node and the polling; ``ray 2 nodes`` adds a placement group of two bundles
(STRICT_SPREAD), a second actor, the rendezvous port asked of the first, and torch's launcher
starting on both nodes (the stand-in runs as one rank per node). Needs root and Debian's slurmctld, slurmd, slurm-client
and munge (tests/slurm_cluster.py starts and ends the cluster), and ray (tests/ray_cluster.py;
its row is left out, said, without it). The clusters' own start-up is not in the figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import ray_cluster  # noqa: E402
from slurm_cluster import SlurmCluster, missing_reason  # noqa: E402


def train(value: float, sleep: float) -> str:
    return f"import time\ntime.sleep({sleep})\nprint('---')\nprint('val_bpb: {value:.6f}')\n"


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def make_repo(folder: Path, trials: int, sleep: float) -> Path:
    repo = folder / "repo"
    repo.mkdir(parents=True)
    (repo / "train.py").write_text(train(1.0, sleep))
    (repo / ".gitignore").write_text("results/*\n__pycache__/\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=b@autoloop.invalid", "-c", "user.name=bench", "commit", "-q", "-m", "initial")
    queue = repo / "results" / "queue"
    queue.mkdir(parents=True)
    for k in range(1, trials):
        (queue / f"{k:02d}.py").write_text(f"# autoloop: candidate {k}\n" + train(1.0 - k / 100, sleep))
    return repo


def night(folder: Path, trials: int, sleep: float, executor: str, env: dict, prefix: tuple[str, ...] = (),
          mode: str = "auto", nodes: int = 1) -> float:
    repo = make_repo(folder, trials, sleep)
    cmd = [*prefix, sys.executable, "-m", "autoloop.cli", "run", "--budget", str(sleep), "--timeout", "120",
           "--proposer",
           "queue", "--tag", "b", "--device", "cpu", "--noise-runs", "0", "--sanity-bound", "0",
           "--command", f"{sys.executable} train.py", "--executor", executor]
    if executor == "slurm":
        cmd += ["--slurm-mode", mode]
    if executor == "ray":
        cmd += ["--gpus-per-trial", "1"]   # a stand-in GPU of a worker node: the trials never land on the head
        cmd += ["--nodes-per-trial", str(nodes)]
    env = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "b@autoloop.invalid",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "b@autoloop.invalid", **env}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - t0
    ledger = repo / "results" / "ledger.jsonl"
    rows = ledger.read_text().splitlines() if ledger.exists() else []
    if proc.returncode != 0 or len(rows) != trials:
        sys.exit(f"engine_overhead: the {executor} night failed ({len(rows)} of {trials} trials recorded):\n"
                 + proc.stdout[-2000:] + proc.stderr[-2000:])
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=1.0)
    parser.add_argument("--engines", default="local,slurm,ray,ray2",
                        help="rows: local, slurm (jobs and steps), ray (an actor per trial), ray2 (two nodes)")
    args = parser.parse_args()
    engines = set(args.engines.split(","))
    walls: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        walls["local"] = night(Path(tmp, "local"), args.trials, args.sleep, "local", {})
    if "slurm" in engines:
        slurm(args, walls)
    no_ray = ray_cluster.missing_reason()
    if no_ray and engines & {"ray", "ray2"}:
        print(f"ray actors: left out ({no_ray})")
    elif engines & {"ray", "ray2"}:
        ray = ray_cluster.RayCluster().start()
        env = {"RAY_ADDRESS": ray.address, "PYTHONPATH": ray.env["PYTHONPATH"]}
        try:
            with tempfile.TemporaryDirectory() as tmp:
                if "ray" in engines:
                    walls["ray actors"] = night(Path(tmp, "ray"), args.trials, args.sleep, "ray", env)
                if "ray2" in engines:
                    walls["ray 2 nodes"] = night(Path(tmp, "ray2"), args.trials, args.sleep, "ray", env, nodes=2)
        finally:
            ray.stop()
            shutil.rmtree(ray.dir, ignore_errors=True)
    print(f"{'executor':11} {'trials':>6} {'night s':>8} {'per trial s':>12} {'overhead/trial s':>17}")
    for name, wall in walls.items():
        per = wall / args.trials
        print(f"{name:11} {args.trials:6d} {wall:8.1f} {per:12.2f} {per - args.sleep:17.2f}")
    for name in [n for n in walls if n != "local"]:
        print(f"{name} add {(walls[name] - walls['local']) / args.trials:.2f} s per trial over local")


def slurm(args: argparse.Namespace, walls: dict[str, float]) -> None:
    """The two Slurm rows, on a private one-node cluster started and ended here."""
    reason = missing_reason()
    if reason:
        sys.exit(f"engine_overhead: {reason}")
    cluster = SlurmCluster().start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            walls["slurm jobs"] = night(Path(tmp, "jobs"), args.trials, args.sleep, "slurm", cluster.env, mode="jobs")
            salloc = ("salloc", "--nodes=1", "--ntasks=1", "--cpus-per-task=2", "--time=30", "--quiet")
            walls["slurm steps"] = night(Path(tmp, "steps"), args.trials, args.sleep, "slurm", cluster.env, salloc,
                                         mode="steps")
    finally:
        cluster.stop()
        shutil.rmtree(cluster.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
