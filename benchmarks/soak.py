"""Kill the orchestrator at random moments, resume, and check that nothing was lost.

A tmp git repo holds a fast fake train.py (0.2-0.5 s per run; ``val_bpb`` from its
constants plus seeded noise, also written to the result file with the run's nonce, as
autoloop.evaluate does) and a queue of changes to it: a seeded random walk of its constants
(some beat the best, most do not), a few of them broken so that they crash (a NameError, a
non-zero exit) or hang past the timeout. Each cycle:

1. start ``autoloop run`` (``--resume`` once the branch exists) as a subprocess;
2. wait a seeded random time (0-3 s by default) and SIGKILL the orchestrator's pid only:
   its trial (or agent, or git) child is orphaned and keeps running; recovery must end it;
3. run ``autoloop run --resume --hours <tiny>``: it recovers and stops before any new
   trial, so the workspace is at rest (after a quarter of the kills, seeded, this step and
   the next are skipped: the next cycle's run recovers from the debris itself, and may be
   killed while it does; those kills are judged at the next check);
4. check every invariant: ledger and results.tsv agree; no duplicate or missing trial or
   attempt (trials 0..n and, per trial, attempts 1..k contiguous); every kept commit is an
   ancestor of the branch head; HEAD is the last record's best, on the branch; a clean
   tree; every recorded commit under its trial ref; state.json not in flight; no process
   left (none whose command line, working directory or AUTOLOOP_* environment points
   into the repo).

A final ``--resume`` runs ``--final-trials`` more trials to the end and is checked too.
It prints the kills, the kills survived with every invariant holding, violations by
kind, where the kills landed (the phase state.json named), trials and attempts recorded,
interrupted rows, and the wall time. Exit code 1 when any invariant was violated.

    python benchmarks/soak.py                     # 60 kills, seed 1
    python benchmarks/soak.py --kills 200 --seed 7 --no-worker --keep
    python benchmarks/soak.py --lookahead 1       # kills with look-ahead candidates in flight too
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
TAG = "soak"
CONSTANTS = {"LR_A": 0.3, "LR_B": 12.0, "WIDTH_C": 0.02, "SCALE_D": 5.0}
OPTIMUM = {"LR_A": 0.08, "LR_B": 3.0, "WIDTH_C": 0.05, "SCALE_D": 5.0}   # as OPT in FAKE_TRAIN

FAKE_TRAIN = '''"""Fake train.py for benchmarks/soak.py: a known value, seeded noise, 0.2-0.5 s."""
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

LR_A = 0.3
LR_B = 12.0
WIDTH_C = 0.02
SCALE_D = 5.0

OPT = {"LR_A": 0.08, "LR_B": 3.0, "WIDTH_C": 0.05, "SCALE_D": 5.0}


def main():
    text = Path(__file__).read_text()
    key = f"{os.environ.get('AUTOLOOP_SEED', '42')}|{hashlib.sha256(text.encode()).hexdigest()}"
    rng = random.Random(int(hashlib.sha256(key.encode()).hexdigest()[:16], 16))
    worker = None
    if os.environ.get("SOAK_WORKER") == "1":
        # A helper process, as a data loader's: train.py ends it itself when it finishes.
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    for step in range(5):
        time.sleep(rng.uniform(0.04, 0.1))
        print(f"step {step:05d} | loss: {5.0 / (step + 1):.4f}", flush=True)
    if worker is not None:
        worker.kill()
        worker.wait()
    value = 1.0 + sum(0.4 * math.log(globals()[k] / v) ** 2 for k, v in OPT.items()) + rng.gauss(0.0, 0.005)
    result = os.environ.get("AUTOLOOP_RESULT")
    if result:
        with open(result, "w") as f:
            json.dump({"metric": "val_bpb", "val_bpb": value, "nonce": os.environ.get("AUTOLOOP_NONCE")}, f)
    print("---")
    print(f"val_bpb:          {value:.6f}")


if __name__ == "__main__":
    main()
'''


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, check=check, capture_output=True, text=True)


def make_repo(repo: Path, queue_size: int, rng: random.Random) -> str:
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    for key, value in (("user.email", "soak@example.com"), ("user.name", "soak"), ("commit.gpgsign", "false")):
        git(repo, "config", key, value)
    (repo / ".gitignore").write_text("results/*\n__pycache__/\n")
    (repo / "train.py").write_text(FAKE_TRAIN)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "fake train.py")
    queue = repo / "results" / "queue"
    queue.mkdir(parents=True)
    # A random walk of the constants, drifting towards the optimum: some versions beat the
    # best so far (keeps, confirmations), most do not.
    values = dict(CONSTANTS)
    for i in range(queue_size):
        name = rng.choice(list(values))
        old = values[name]
        towards = 1.0 if OPTIMUM[name] > old else -1.0
        step = rng.choice((1.15, 1.3, 1.6)) ** (towards if rng.random() < 0.6 else -towards)
        values[name] = new = round(old * step, 5)
        text = FAKE_TRAIN
        for key, value in values.items():
            text = text.replace(f"\n{key} = {CONSTANTS[key]}\n", f"\n{key} = {value}\n", 1)
        description = f"{name} {old} -> {new}"
        roll = rng.random()
        if roll < 0.06:   # a trivial crash: the queue cannot fix it, the loop moves on
            text, description = text.replace("rng.gauss(0.0", "rgn.gauss(0.0", 1), description + " (typo)"
        elif roll < 0.10:
            text = text.replace("    value = ", "    sys.exit(3)\n    value = ", 1)
            description += " (exit 3)"
        elif roll < 0.12:
            text = text.replace("def main():\n", "def main():\n    time.sleep(60)\n", 1)
            description += " (hang)"
        (queue / f"{i:04d}.py").write_text(f"# autoloop: {description}\n{text}")
    return git(repo, "rev-parse", "HEAD").stdout.strip()


# ------------------------------------------------------------------------------ invariants


def leftover_processes(repo: Path) -> list[psutil.Process]:
    """Live processes (zombies excluded) whose command line, working directory or
    AUTOLOOP_* environment points into the repo: trials, their children, agents, git."""
    root, found = str(repo), []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            hit = any(root in part for part in (proc.info["cmdline"] or []))
            hit = hit or proc.cwd().startswith(root)
            hit = hit or any(k.startswith("AUTOLOOP_") and root in v for k, v in proc.environ().items())
        except psutil.Error:
            continue
        if hit:
            found.append(proc)
    return found


def describe_process(proc: psutil.Process) -> str:
    return f"{proc.pid} {' '.join(proc.info['cmdline'] or [])[:80]}"


def read_ledger(repo: Path) -> list[dict]:
    path = repo / "results" / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def read_tsv(repo: Path) -> list[dict]:
    path = repo / "results" / "results.tsv"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    # strict=False: a row cut short by a kill mid-write keeps the columns it has
    return [dict(zip(lines[0].split("\t"), line.split("\t"), strict=False)) for line in lines[1:]]


def check(repo: Path, initial: str) -> dict[str, str]:
    """Violated invariants at rest: kind -> one line of evidence (empty when all hold)."""
    bad: dict[str, str] = {}
    ledger = read_ledger(repo)
    branch = f"autoloop/{TAG}"
    head = git(repo, "rev-parse", "HEAD").stdout.strip()

    judged = [r for r in ledger if r["status"] != "skip"]
    tsv = read_tsv(repo)
    expected = [((r["trial"], r["attempt"]), r["status"], r["crash"] or "-", (r["commit"] or "-")[:7]) for r in judged]
    got = [(_label_key(row["trial"]), row["status"], row["crash"], row["commit"]) for row in tsv]
    if expected != got:
        bad["ledger_tsv_disagree"] = f"{len(expected)} judged records, {len(tsv)} TSV rows"

    keys = [(r["trial"], r["attempt"]) for r in ledger]
    if len(keys) != len(set(keys)):
        bad["duplicate_attempt"] = str([k for k, n in collections.Counter(keys).items() if n > 1])
    attempts: dict[int, list[int]] = collections.defaultdict(list)
    for trial, attempt in keys:
        attempts[trial].append(attempt)
    gaps = [t for t, a in attempts.items() if sorted(a) != list(range(1, len(a) + 1))]
    if gaps or sorted(attempts) != list(range(len(attempts))):
        bad["missing_attempt"] = f"trials {sorted(attempts)[:5]}..., attempts not contiguous in {gaps[:5]}"

    for r in ledger:
        if r["status"] != "keep":
            continue
        if git(repo, "merge-base", "--is-ancestor", r["commit"], branch, check=False).returncode:
            bad["kept_commit_lost"] = f"trial {r['trial']}.{r['attempt']} {r['commit'][:7]}"
    bests = [r["best"] for r in ledger if r["best"]]
    want = bests[-1] if bests else initial
    if head != want:
        bad["head_not_best"] = f"HEAD {head[:7]}, best {want[:7]}"
    current = git(repo, "rev-parse", "--abbrev-ref", "HEAD").stdout.strip()
    if ledger and current != branch:
        bad["not_on_branch"] = current
    status = git(repo, "status", "--porcelain").stdout.strip()
    if status:
        bad["dirty_tree"] = status.splitlines()[0]
    refs = set(git(repo, "for-each-ref", "--format=%(objectname)", f"refs/autoloop/{TAG}/trials").stdout.split())
    lost = [r for r in ledger if r["commit"] and r["commit"] not in refs]
    if lost:
        bad["trial_unreachable"] = f"trial {lost[0]['trial']}.{lost[0]['attempt']}"
    state_file = repo / "results" / "state.json"
    if state_file.exists():
        phase = json.loads(state_file.read_text()).get("phase")
        if phase not in ("idle", "stopped"):
            bad["state_in_flight"] = phase
    for ahead in (repo / "results").glob("state*-ahead.json"):   # look-ahead: recovery finishes it too
        if json.loads(ahead.read_text()).get("phase") not in ("idle", "stopped"):
            bad["lookahead_in_flight"] = ahead.name
    ran = {r["trial"] for r in ledger}
    twice = [p.stem for p in (repo / "results" / "prepared").glob("*.json") if p.stem.isdigit() and int(p.stem) in ran]
    if twice:   # a prepared candidate whose trial has a record must never be pending again
        bad["prepared_after_its_record"] = ", ".join(twice)
    left = leftover_processes(repo)
    if left:
        bad["process_left"] = "; ".join(map(describe_process, left[:3]))
    return bad


def _label_key(label: str) -> tuple[int, int]:
    trial, _, attempt = label.partition(".")
    return int(trial), int(attempt or 1)


# ------------------------------------------------------------------------------ the soak


LOOKAHEAD = ["--lookahead", "0"]   # main() sets it from --lookahead


def autoloop_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "autoloop.cli", "run", "--budget", "1", "--timeout", "4", "--proposer", "queue",
            "--tag", TAG, "--noise-runs", "1", "--device", "cpu", *LOOKAHEAD, *args]


def branch_exists(repo: Path) -> bool:
    return git(repo, "rev-parse", "--verify", "-q", f"refs/heads/autoloop/{TAG}", check=False).returncode == 0


@dataclass
class Tally:
    """What the kills found: invariants broken (by kind, with an example), phases hit."""
    violations: collections.Counter[str] = field(default_factory=collections.Counter)
    examples: dict[str, str] = field(default_factory=dict)
    phases: collections.Counter[str] = field(default_factory=collections.Counter)
    survived: int = 0
    ended_alone: int = 0
    checks: int = 0

    def add(self, bad: dict[str, str], where: str) -> None:
        for kind, why in bad.items():
            self.violations[kind] += 1
            self.examples.setdefault(kind, f"{where}: {why}")


def soak(args, work: Path) -> int:
    rng = random.Random(args.seed)
    repo = work / "repo"
    initial = make_repo(repo, queue_size=args.kills * 10 + args.final_trials + 20, rng=rng)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "SOAK_WORKER": "1" if args.worker else "0"}
    if args.data_dir:
        env["AUTOLOOP_DATA_DIR"] = args.data_dir
    tally, t0 = Tally(), time.time()
    pending: list[int] = []   # kills not yet followed by an at-rest check
    for i in range(1, args.kills + 1):
        _kill_one_run(repo, env, rng, args.max_wait, tally)
        pending.append(i)
        if i < args.kills and rng.random() < args.chain:
            continue   # the next run starts from this debris: it recovers, and may be killed doing so
        bad = _at_rest(repo, env, initial)
        tally.checks += 1
        if not bad:
            tally.survived += len(pending)
        tally.add(bad, f"kill {i}")
        if args.verbose:
            print(f"kills {pending[0]}-{i}: " if len(pending) > 1 else f"kill {i}: ",
                  "ok" if not bad else ", ".join(bad), sep="", flush=True)
        pending = []

    final = subprocess.run(autoloop_cmd("--resume", "--max-trials", str(args.final_trials)), cwd=repo, env=env,
                           capture_output=True, text=True, timeout=600, check=False)
    final_bad = {} if final.returncode == 0 else {"final_run_failed": (final.stderr.strip() or final.stdout)[-200:]}
    final_bad.update(check(repo, initial))
    tally.add(final_bad, "final")
    wall = time.time() - t0
    _print_summary(args, tally, final_bad, read_ledger(repo), wall)
    if args.keep:
        print(f"repo kept at {repo}")
    return 1 if tally.violations else 0


def _kill_one_run(repo: Path, env: dict[str, str], rng: random.Random, max_wait: float, tally: Tally) -> None:
    """Start the loop, SIGKILL the orchestrator at a random moment, note the phase it was in."""
    resume = ["--resume"] if branch_exists(repo) else []
    proc = subprocess.Popen(autoloop_cmd(*resume, "--max-trials", "100000"), cwd=repo, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        proc.wait(timeout=rng.uniform(0.0, max_wait))
        tally.ended_alone += 1   # it stopped by itself before the kill (it should not)
        tally.examples.setdefault("ended_before_kill", (proc.stderr.read() or "").strip()[-200:])
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)   # the orchestrator only: its children live on
        proc.wait()
    proc.stderr.close()
    state_file = repo / "results" / "state.json"
    try:
        tally.phases[json.loads(state_file.read_text()).get("phase") or "?"] += 1
    except (OSError, ValueError):
        tally.phases["(no state yet)"] += 1


def _at_rest(repo: Path, env: dict[str, str], initial: str) -> dict[str, str]:
    """Recover and stop before any new trial, then check the invariants of a workspace at rest."""
    if not branch_exists(repo):
        return {k: v for k, v in check(repo, initial).items() if k in ("process_left", "dirty_tree")}
    rest = subprocess.run(autoloop_cmd("--resume", "--hours", "1e-9"), cwd=repo, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    bad = {} if rest.returncode == 0 else {"resume_failed": (rest.stderr.strip() or rest.stdout)[-200:]}
    bad.update(check(repo, initial))
    return bad


def _print_summary(args, tally: Tally, final_bad: dict[str, str], ledger: list[dict], wall: float) -> None:
    print(f"soak: seed {args.seed}, {args.kills} SIGKILLs of the orchestrator at 0-{args.max_wait:g} s, "
          f"worker processes {'on' if args.worker else 'off'}")
    print(f"kills survived with every invariant holding: {tally.survived}/{args.kills}, {tally.checks} at-rest checks"
          + (f" ({tally.ended_alone} runs ended before their kill)" if tally.ended_alone else ""))
    print(f"final run to --max-trials {args.final_trials}: {'ok' if not final_bad else ', '.join(final_bad)}")
    print("violations by kind: " + (", ".join(f"{k} {n}" for k, n in tally.violations.most_common()) or "none"))
    for kind, why in tally.examples.items():
        print(f"  {kind}: {why}")
    print("kills by phase: " + ", ".join(f"{k} {n}" for k, n in tally.phases.most_common()))
    trials = len({r["trial"] for r in ledger})
    interrupted = sum(1 for r in ledger if (r["reason"] or "").startswith("interrupted"))
    statuses = collections.Counter(r["status"] for r in ledger)
    print(f"recorded: {trials} trials, {len(ledger)} attempts ({', '.join(f'{k} {n}' for k, n in statuses.items())}), "
          f"{interrupted} interrupted rows")
    print(f"wall time: {wall:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-wait", type=float, default=3.0, help="seconds: each kill lands at uniform(0, this)")
    ap.add_argument("--chain", type=float, default=0.25,
                    help="chance that a kill is not followed by an at-rest check: the next run then recovers "
                         "from it, and may be killed while recovering (default 0.25)")
    ap.add_argument("--final-trials", type=int, default=10)
    ap.add_argument("--worker", action=argparse.BooleanOptionalAction, default=True,
                    help="each fake train.py runs a helper process while it trains, as a data loader does (default on)")
    ap.add_argument("--lookahead", type=int, choices=[0, 1], default=0,
                    help="1: the queue proposes the next trial while one trains, so kills also land with "
                         "a candidate prepared or being prepared (default 0)")
    ap.add_argument("--data-dir", help="prepared data (default: autoloop's per-user cache)")
    ap.add_argument("--keep", action="store_true", help="keep the tmp repo for inspection")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per kill")
    args = ap.parse_args()
    LOOKAHEAD[1] = str(args.lookahead)
    work = Path(tempfile.mkdtemp(prefix="autoloop-soak-"))
    try:
        return soak(args, work)
    finally:
        for proc in leftover_processes(work):   # what a violation left running: ours to end
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
