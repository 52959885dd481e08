"""A night of random faults: nothing recorded may be lost, duplicated or changed.

An accelerated night on benchmarks/soak.py's scripted train.py (1-second trials, a helper
process each, the queue of a seeded random walk) in cycles of a few trials, workers 1 and 2
in turn, look-ahead on. Each cycle draws one fault and injects it while the orchestrator runs:

* ``kill9``        SIGKILL of the orchestrator at a random moment (its trial lives on);
* ``kill_trial``   SIGKILL of a trial's main process, or of the helper it started;
* ``agent_hang``, ``agent_crash``, ``agent_garbage``: the cycle's proposer is a scripted agent
                   that hangs past --agent-timeout, exits 1 with a traceback, or prints bytes
                   of garbage and changes nothing;
* ``full_disk``    the filesystem results/ lives on filled up (a small tmpfs mounted for the
                   run; where mounting is refused, the fault is skipped and says so);
* ``enospc_ledger``, ``eio_ledger``, ``enospc_tsv``, ``eio_tsv``: the n-th write of
                   ledger.jsonl or results.tsv fails (AUTOLOOP_FAULT_WRITE, store/atomic.py);
* ``index_lock``   a stale .git/index.lock, as a git killed mid-command leaves, then kill9;
* ``clock_jump``   the wall clock of the orchestrator (and of all it starts) stepped back 2 h,
                   then forward 3 h, mid-run, with --hours 1 (benchmarks/clockstep.c, an
                   LD_PRELOAD library built here with cc; the machine's clock is not touched;
                   skipped and said where no C compiler is). The cycle must end by itself,
                   at its --max-trials, with no attempt timed out: a deadline, budget or
                   timeout on the wall clock would end it early or cut a run off.

After each cycle ``autoloop run --resume --hours 1e-9`` recovers and stops at rest, and every
invariant of soak.py is checked. Printed: faults injected and survived (by kind), records
lost (a record seen before the cycle and missing after), records duplicated, attempts whose
verdict changed across a resume, and the device time lost per fault (the seconds of the
attempts the fault cut off or killed).

    python benchmarks/chaos.py                    # >= 400 attempts, seed 1
    python benchmarks/chaos.py --attempts 20 --seed 3
    python benchmarks/chaos.py --attempts 20 --seed 5 --faults kill9,... --cycle-trials 3-5
                                                  # tests/test_chaos.py: each fault once, short cycles
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
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import soak

REPO = soak.REPO
FAULTS = ["kill9", "kill_trial", "agent_hang", "agent_crash", "agent_garbage", "full_disk", "enospc_ledger",
          "eio_ledger", "enospc_tsv", "eio_tsv", "index_lock", "clock_jump"]
CLOCKSTEP_C = Path(__file__).resolve().parent / "clockstep.c"
AGENT = '''import os, sys, time
mode = sys.argv[1]
sys.stdin.read()
if mode == "hang":
    time.sleep(600)
if mode == "crash":
    print("Traceback (most recent call last):\\nRuntimeError: the agent fell over", file=sys.stderr)
    sys.exit(1)
sys.stdout.buffer.write(os.urandom(4096))
'''


def train_source() -> str:
    # soak's stand-in, made to train for the budget (five steps of budget/5 s).
    return soak.FAKE_TRAIN.replace("time.sleep(rng.uniform(0.04, 0.1))",
                                   "time.sleep(float(os.environ.get('AUTOLOOP_BUDGET_S', '1')) / 5)")


def keyed(records: list[dict]) -> dict[tuple[int, int], dict]:
    return {(r["trial"], r["attempt"]): r for r in records}


def verdict(r: dict) -> tuple:
    return r["status"], r["crash"], r["metric"], r["commit"], r["best"]


class Chaos:
    def __init__(self, args, work: Path):
        self.args, self.work, self.rng = args, work, random.Random(args.seed)
        self.repo = work / "repo"
        self.mounted = False
        self.clockstep: Path | None = None
        self.injected: collections.Counter[str] = collections.Counter()
        self.survived: collections.Counter[str] = collections.Counter()
        self.skipped: collections.Counter[str] = collections.Counter()
        self.lost_s: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.lost = self.duplicated = self.changed = self.gaps = 0
        self.examples: dict[str, str] = {}

    # -- setup ----------------------------------------------------------------------------

    def setup(self) -> None:
        if self.args.tmpfs_mb and os.geteuid() == 0:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.args.tmpfs_mb}m", "tmpfs",
                                   str(self.work)], capture_output=True, text=True, check=False)
            self.mounted = done.returncode == 0
            if not self.mounted:
                print(f"chaos: no tmpfs ({done.stderr.strip() or done.returncode}): full_disk is skipped")
        else:
            print("chaos: not root (or --tmpfs-mb 0): no tmpfs, full_disk is skipped")
        self.clockstep = self.build_clockstep()
        soak.FAKE_TRAIN = train_source()
        self.initial = soak.make_repo(self.repo, self.args.attempts * 2 + 50, self.rng)
        (self.work / "agent.py").write_text(AGENT)
        self.env = {**os.environ, "SOAK_WORKER": "1",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        if self.args.data_dir:
            self.env["AUTOLOOP_DATA_DIR"] = self.args.data_dir

    def build_clockstep(self) -> Path | None:
        """clockstep.so, built from benchmarks/clockstep.c; None (clock_jump skipped) without cc."""
        cc = shutil.which("cc") or shutil.which("gcc")
        lib = self.work / "clockstep.so"
        done = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(CLOCKSTEP_C), "-ldl"],
                              capture_output=True, text=True, check=False) if cc else None
        if done is None or done.returncode != 0:
            print(f"chaos: clockstep.c not built ({done.stderr.strip()[-200:] if done else 'no cc'}): "
                  "clock_jump is skipped")
            return None
        return lib

    def teardown(self) -> None:
        for proc in soak.leftover_processes(self.work):
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.work)], check=False, capture_output=True)

    def command(self, workers: int, *args: str) -> list[str]:
        return [sys.executable, "-m", "autoloop.cli", "run", "--budget", "1", "--timeout", "6", "--tag", soak.TAG,
                "--noise-runs", "1", "--device", "cpu", "--lookahead", "1", "--workers", str(workers),
                "--command", f"{sys.executable} train.py", "--sanity-bound", "0",
                # The tmpfs is small: the free-space stop at 5 MB, so a full disk is met as it fills.
                "--min-free-gb", "0.005", *args]

    # -- one cycle ------------------------------------------------------------------------

    def cycle(self, fault: str, workers: int) -> tuple[bool, str]:
        before = keyed(soak.read_ledger(self.repo))
        resume = ["--resume"] if soak.branch_exists(self.repo) else []
        lo, hi = self.args.cycle_trials
        max_trials = self.rng.randint(lo, hi)
        if fault == "clock_jump":
            # The steps land 1-3 s and 2-6 s into the cycle: it must still be running then (at
            # the default 6-14 trials it is; fewer could end before the forward step).
            max_trials = max(max_trials, 6)
        env, extra = dict(self.env), ["--max-trials", str(max_trials)]
        if fault.startswith("agent_"):
            extra = ["--proposer", "agent", "--agent-cmd", f"{sys.executable} {self.work / 'agent.py'} "
                     f"{fault.split('_')[1]}", "--agent-timeout", "3", "--skip-preflight",
                     "--max-agent-failures", "1", "--max-trials", "2"]
        else:
            extra += ["--proposer", "queue"]
        if fault in ("enospc_ledger", "eio_ledger", "enospc_tsv", "eio_tsv"):
            code, what = fault.split("_")
            # A cycle's run writes each file about once per attempt it judges, and with look-ahead
            # and two workers it judges fewer attempts than its --max-trials (prepared ones count):
            # a cycle of 3-5 trials (the test's) reached its 2nd or 3rd write but rarely a later
            # one, so short cycles take n from 2-3 and the fault fires; the default draw is kept.
            nth = self.rng.randint(2, 12)
            if hi < 6:
                nth = 2 + nth % 2
            env["AUTOLOOP_FAULT_WRITE"] = (f"{code.upper()}:{'ledger.jsonl' if what == 'ledger' else 'results.tsv'}"
                                           f":{nth}")
        clock = self.work / "clockstep"
        if fault == "clock_jump":
            clock.write_text("0\n")
            env.update(LD_PRELOAD=str(self.clockstep), CLOCKSTEP_FILE=str(clock))
            extra += ["--hours", "1"]   # a deadline on the wall clock would pass at the step forward
        if fault == "index_lock":
            (self.repo / ".git" / "index.lock").write_bytes(b"")
        filler = self.repo / "results" / "filler"
        out_path = self.work / "cycle.out"
        with open(out_path, "w") as out:
            proc = subprocess.Popen(self.command(workers, *resume, *extra), cwd=self.repo, env=env,
                                    stdout=out, stderr=subprocess.PIPE, text=True)
            self.inject(fault, proc, clock, filler)
            try:
                proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        err = proc.stderr.read() if proc.stderr else ""
        if proc.stderr:
            proc.stderr.close()
        filler.unlink(missing_ok=True)
        stepped = self.clock_step_violation(proc.returncode, out_path.read_text(), before) \
            if fault == "clock_jump" else None
        ok, said = self.at_rest(fault, before, err)
        if stepped:
            self.examples.setdefault("clock_jump/wall_clock", stepped)
            return False, stepped
        return ok, said

    def clock_step_violation(self, code: int | None, out: str, before: dict) -> str | None:
        """What a stepped wall clock did to the cycle that it must not: an early end, a timeout."""
        stopped = [line for line in out.splitlines() if " stopped: " in line]
        if code != 0 or not stopped or "reached --max-trials" not in stopped[-1]:
            return f"exit {code}: {(stopped or out.splitlines() or ['no output'])[-1][-150:]}"
        # The queue's own hangs (soak.make_repo: "(hang)", 2 % of it) time out by design.
        timed_out = [(k, r["reason"]) for k, r in keyed(soak.read_ledger(self.repo)).items()
                     if k not in before and r["crash"] == "timeout" and not r["description"].endswith("(hang)")]
        return (f"timed out across the step: {[k for k, _ in timed_out[:3]]} ({timed_out[0][1][:80]})"
                if timed_out else None)

    def inject(self, fault: str, proc: subprocess.Popen, clock: Path, filler: Path) -> None:
        rng = self.rng
        if fault in ("kill9", "index_lock"):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=rng.uniform(1.0, 15.0))
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        elif fault == "kill_trial":
            victim = self.wait_for_trial(proc)
            if victim is not None:
                with contextlib.suppress(psutil.Error):
                    kids = victim.children()
                    (rng.choice(kids) if kids and rng.random() < 0.5 else victim).kill()
        elif fault == "full_disk":
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=rng.uniform(1.0, 8.0))
            with contextlib.suppress(OSError), open(filler, "wb") as f:
                while True:
                    f.write(b"\0" * (1 << 20))
        elif fault == "clock_jump":
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=rng.uniform(1.0, 3.0))
            clock.write_text("-7200\n")
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=rng.uniform(1.0, 3.0))
            clock.write_text("10800\n")

    def wait_for_trial(self, proc: subprocess.Popen) -> psutil.Process | None:
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            for path in (self.repo / "results").glob("state*.json"):
                with contextlib.suppress(OSError, ValueError, psutil.Error):
                    state = json.loads(path.read_text())
                    if state.get("phase") == "running" and state.get("child_pids") and not path.name.endswith(
                            "ahead.json"):
                        pid, created = state["child_pids"][0]
                        victim = psutil.Process(pid)
                        if abs(victim.create_time() - created) < 1.0:
                            time.sleep(self.rng.uniform(0.1, 0.6))
                            return victim
            time.sleep(0.05)
        return None

    def at_rest(self, fault: str, before: dict, err: str) -> tuple[bool, str]:
        if not soak.branch_exists(self.repo):   # killed before the night began: nothing to resume
            bad = {k: v for k, v in soak.check(self.repo, self.initial).items() if k in ("process_left", "dirty_tree")}
            return not bad, ", ".join(bad) or "killed before the branch existed"
        rest = subprocess.run(self.command(1, "--resume", "--hours", "1e-9", "--proposer", "queue"), cwd=self.repo,
                              env=self.env, capture_output=True, text=True, timeout=180, check=False)
        bad = {} if rest.returncode == 0 else {"resume_failed": (rest.stderr.strip() or rest.stdout)[-200:]}
        bad.update(soak.check(self.repo, self.initial))
        if "missing_attempt" in bad and "attempts not contiguous in []" in bad["missing_attempt"]:
            # Only trial numbers skipped (each trial's attempts contiguous): a number reserved by
            # a run that died before its proposal began has no record; nothing recorded went
            # missing (that is records_lost below). Counted and shown, not a violation.
            self.gaps += 1
            del bad["missing_attempt"]
        after_list = soak.read_ledger(self.repo)
        after = keyed(after_list)
        lost = [k for k in before if k not in after]
        changed = [k for k in before if k in after and verdict(before[k]) != verdict(after[k])]
        self.lost += len(lost)
        self.changed += len(changed)
        self.duplicated += len(after_list) - len(after)
        if lost:
            bad["record_lost"] = str(lost[:3])
        if changed:
            bad["verdict_changed"] = str(changed[:3])
        for key, r in after.items():   # the device time the fault cost: attempts it cut off or killed
            if key not in before and r["status"] == "crash" and r["kind"] != "baseline":
                # The run's own seconds (monotonic): started_at/ended_at are wall clock, which
                # the clock_jump fault steps by hours.
                # An interrupted attempt has none: its span, except where the clock was stepped.
                span = (r["ended_at"] or 0) - (r["started_at"] or 0) if fault != "clock_jump" else 0.0
                self.lost_s[fault] += r.get("wall_seconds") or r.get("total_seconds") or max(0.0, span)
        for kind, why in bad.items():
            self.examples.setdefault(f"{fault}/{kind}", why)
        return not bad, ", ".join(bad) or (err.strip().splitlines() or ["ok"])[-1][:100]

    # -- the night ------------------------------------------------------------------------

    def run(self) -> int:
        t0, i, stuck, last = time.time(), 0, 0, 0
        while len(soak.read_ledger(self.repo)) < self.args.attempts or i < len(self.args.faults or []):
            i += 1
            count = len(soak.read_ledger(self.repo))
            stuck, last = (stuck + 1 if count == last else 0), count
            if stuck >= 8:
                print(f"chaos: no new attempt in 8 cycles; stopping. {self.examples}")
                return self.report(time.time() - t0) or 1
            # --faults: in turn (the test suite's small night covers each); else drawn at random.
            fault = self.args.faults[(i - 1) % len(self.args.faults)] if self.args.faults else self.rng.choice(FAULTS)
            if fault.startswith("agent_") and not soak.branch_exists(self.repo):
                fault = "kill9"   # the agent proposes trials: the baseline comes first
            if (fault == "full_disk" and not self.mounted) or (fault == "clock_jump" and self.clockstep is None):
                self.skipped[fault] += 1
                fault = "kill9"
            workers = 1 + i % 2
            self.injected[fault] += 1
            ok, said = self.cycle(fault, workers)
            self.survived[fault] += ok
            print(f"cycle {i} (workers {workers}) {fault}: {'survived' if ok else 'VIOLATED'} "
                  f"({said}); {len(soak.read_ledger(self.repo))}/{self.args.attempts} attempts, "
                  f"{time.time() - t0:.0f} s", flush=True)
        return self.report(time.time() - t0)

    def report(self, wall: float) -> int:
        ledger = soak.read_ledger(self.repo)
        total, ok = sum(self.injected.values()), sum(self.survived.values())
        print(f"chaos: seed {self.args.seed}, {len(ledger)} attempts in {len({r['trial'] for r in ledger})} trials, "
              f"wall {wall:.0f} s")
        print(f"faults injected: {total}; survived: {ok}")
        for fault in FAULTS:
            if self.injected[fault] or self.skipped[fault]:
                per = self.lost_s[fault] / self.injected[fault] if self.injected[fault] else 0.0
                print(f"  {fault:14} injected {self.injected[fault]:3}  survived {self.survived[fault]:3}  "
                      f"device time lost per fault {per:5.2f} s"
                      + (f"  (skipped {self.skipped[fault]}: not available here)" if self.skipped[fault] else ""))
        print(f"records lost: {self.lost}")
        print(f"records duplicated: {self.duplicated}")
        print(f"attempts whose verdict changed across a resume: {self.changed}")
        print(f"cycles after which a trial number had no record (reserved, never proposed): {self.gaps}")
        reruns = sum(1 for r in ledger if r["extra"].get("rerun_of"))
        print(f"interrupted attempts run again by --resume: {reruns}")
        for what, why in self.examples.items():
            print(f"  {what}: {why}")
        return 0 if ok == total and not (self.lost or self.duplicated or self.changed) else 1


def trials_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    try:
        pair = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO-HI, e.g. 6-14, got {text!r}") from None
    if not 1 <= pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"expected 1 <= LO <= HI, got {text!r}")
    return pair


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attempts", type=int, default=400, help="run until the ledger holds this many (default 400)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tmpfs-mb", type=int, default=48, help="size of the tmpfs the run lives on (0: none)")
    ap.add_argument("--faults", type=lambda v: [f for f in v.split(",") if f],
                    help="comma-separated, injected in turn, each at least once (default: drawn at random)")
    ap.add_argument("--data-dir", help="prepared data (default: autoloop's per-user cache)")
    ap.add_argument("--cycle-trials", type=trials_range, default=(6, 14), metavar="LO-HI",
                    help="each queue cycle's --max-trials, drawn in LO..HI (default 6-14)")
    args = ap.parse_args()
    unknown = sorted(set(args.faults or []) - set(FAULTS))
    if unknown:
        ap.error(f"unknown fault {', '.join(unknown)} (known: {', '.join(FAULTS)})")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # a timeout's SIGTERM still unmounts the tmpfs
    work = Path(tempfile.mkdtemp(prefix="autoloop-chaos-"))
    chaos = Chaos(args, work)
    try:
        chaos.setup()
        return chaos.run()
    finally:
        chaos.teardown()
        if os.environ.get("CHAOS_KEEP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
