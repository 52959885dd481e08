"""Does the device wait for the agent? Serial proposing against look-ahead (--lookahead 1).

Runs `autoloop run --lookahead 0` and `--lookahead 1` through the real CLI in fresh
temporary repositories, with a fake coding agent (tests/fake_agents/scripted.py) that
thinks AGENT_S seconds before each edit, and reads the ledgers: trials per hour and the
device-busy share (wall time with a trial running / wall time, from the end of the
baseline to the end of the last trial: the first proposal, which nothing can hide, is in
it), computed by ``autoloop.store.queries.pipeline``, as `autoloop status` shows it.

Two trial kinds (``--kind``):

* ``sleep``: a train.py stand-in that sleeps its budget and prints a metric of its
  constants (12 of them, on lines of their own; trial k moves constant k, better on odd k,
  worse on even k, so that every prepared change merges onto a moved best). The default,
  a 10 s budget and a 4 s agent, is the ratio of a 5-minute budget to a 2-minute agent.
* ``real``: this repository's train.py at a short budget on the CPU, the agent moving one
  real constant per trial.
* ``same``: the sleeping stand-in, but the agent sets the same constant every time (as real
  agents come back to the learning rate), one value in three better than the best: after
  each keep the change prepared on the old best sets the line the keep just set. Run it
  against another checkout with ``--autoloop ROOT`` for a before/after in one run.

    python benchmarks/pipeline.py                               # both kinds
    python benchmarks/pipeline.py --kind sleep --trials 12 --budget 10 --agent-s 4
    python benchmarks/pipeline.py --kind same --budget 6 --agent-s 3 --autoloop /path/to/old/checkout
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from parallel import make_repo, prepare_small_data  # noqa: E402   (a fresh repository; the data)

from autoloop.store import queries  # noqa: E402
from autoloop.store.ledger import Ledger  # noqa: E402

AGENT = REPO / "tests" / "fake_agents" / "scripted.py"
CONSTANTS = 12

# Real train.py constants two or more lines apart (adjacent changed lines would not merge).
REAL_EDITS = ["MATRIX_LR=0.05", "EMBED_LR=0.5", "SCALAR_LR=0.03", "WEIGHT_DECAY=0.01", "WARMUP_FRAC=0.05",
              "FINAL_LR_FRAC=0.1", "ROPE_BASE=5000.0", "DEPTH=2", "SEQ_LEN=96", "CONV_TAPS=3", "GRAD_CLIP=0.5",
              "MUON_MOMENTUM=0.9"]


def sleeper() -> str:
    lines = ["import os, time", ""]
    for k in range(1, CONSTANTS + 1):
        lines += [f"C{k} = 1.0", "# " + "-" * 60, ""]
    lines += ['time.sleep(float(os.environ["AUTOLOOP_BUDGET_S"]))',
              f"print(f\"val_bpb: {{{' + '.join(f'C{k}' for k in range(1, CONSTANTS + 1))}:.6f}}\")", ""]
    return "\n".join(lines)


def script(kind: str, trials: int) -> list[str]:
    """The agent's edit for each trial number (a conflict's fresh request gets the next one)."""
    if kind == "sleep":
        return [f"{t}:C{(t - 1) % CONSTANTS + 1}={0.5 if t % 2 else 1.5}" for t in range(1, 2 * trials + 1)]
    if kind == "same":   # C1 lower (better) every third trial, each time below the last keep; else higher
        return [f"{t}:C1={1.0 - 0.01 * t if t % 3 == 0 else 2.0 + 0.01 * t:.2f}" for t in range(1, 2 * trials + 1)]
    return [f"{t}:{REAL_EDITS[(t - 1) % len(REAL_EDITS)]}" for t in range(1, 2 * trials + 1)]


def run(kind: str, lookahead: int, trials: int, budget: float, agent_s: float, data: Path, tmp: Path,
        package: Path = REPO) -> dict:
    root = tmp / f"{kind}-lookahead{lookahead}-{abs(hash(str(package)))}"
    make_repo(root, (REPO / "train.py").read_text() if kind == "real" else sleeper())
    agent = f"{sys.executable} {AGENT} {{prompt_file}} --sleep {agent_s:g} {' '.join(script(kind, trials))}"
    cmd = [sys.executable, "-m", "autoloop.cli", "run", "--agent-cmd", agent, "--skip-preflight", "--tag", "bench",
           "--budget", f"{budget:g}", "--max-trials", str(trials), "--lookahead", str(lookahead),
           "--noise-runs", "0", "--sanity-bound", "0", "--device", "cpu"]
    if kind != "real":
        cmd += ["--command", f"{sys.executable} train.py"]
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(data), "PYTHONPATH": str(package)}
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        sys.exit(proc.stdout + proc.stderr)
    records = Ledger(root / "results", fsync=False).records()
    base = queries.baseline(records)
    p = queries.pipeline(records, base.ended_at)
    work = [r for r in records if r.kind != "baseline"]
    return {"trials": p.trials, "span": p.span_s, "wall": wall, "per_hour": p.trials / p.span_s * 3600,
            "busy": p.busy_share, "propose": p.propose_s, "skips": sum(r.status == "skip" for r in work),
            "kept": sum(r.status == "keep" for r in work), "best": queries.best(records)[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=["sleep", "real", "same", "both"], default="both",
                        help="both: sleep and real")
    parser.add_argument("--autoloop", type=Path, default=None,
                        help="another checkout whose package runs beside this one's (a before/after)")
    parser.add_argument("--trials", type=int, default=12, help="trials per night (default 12)")
    parser.add_argument("--budget", type=float, default=10.0, help="seconds per trial (default 10)")
    parser.add_argument("--agent-s", type=float, default=4.0, help="the agent's thinking per proposal (default 4)")
    parser.add_argument("--real-trials", type=int, default=6, help="trials per night of the real kind (default 6)")
    args = parser.parse_args()
    kinds = ["sleep", "real"] if args.kind == "both" else [args.kind]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "data"
        prepare_small_data(data)
        print(f"{os.cpu_count()} CPU cores; load {os.getloadavg()[0]:.2f}; budget {args.budget:g} s; "
              f"agent {args.agent_s:g} s per proposal")
        for kind in kinds:
            trials = args.real_trials if kind == "real" else args.trials
            print(f"\n{kind}: {trials} trials")
            print(f"| {'mode':17} | {'trials':>6} | {'span s':>7} | {'trials/h':>8} | {'device busy':>11} | "
                  f"{'proposer s/trial':>16} | {'skips':>5} | {'kept':>4} | {'best':>9} |")
            print(f"|{'-' * 19}|{'-' * 8}|{'-' * 9}|{'-' * 10}|{'-' * 13}|{'-' * 18}|{'-' * 7}|{'-' * 6}|{'-' * 11}|")
            serial, ahead = None, {}
            runs = [(0, REPO, "serial"), (1, REPO, "look-ahead")]
            if args.autoloop:
                runs.append((1, args.autoloop.resolve(), "ahead, --autoloop"))
            for lookahead, package, mode in runs:
                r = run(kind, lookahead, trials, args.budget, args.agent_s, data, tmp, package)
                serial = serial or r["per_hour"]
                ahead = r if package == REPO else ahead
                print(f"| {mode:17} | {r['trials']:>6} | {r['span']:>7.1f} | {r['per_hour']:>8.0f} | "
                      f"{r['busy']:>10.1%} | {r['propose']:>16.2f} | {r['skips']:>5} | {r['kept']:>4} | "
                      f"{r['best']:>9.4f} |", flush=True)
            print(f"look-ahead / serial trials per hour: {ahead['per_hour'] / serial:.2f}x; "
                  f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
