"""Helpers for the end-to-end tests: the real CLI in real git repos, a scripted train.py.

The loop's logic is tested on tests/trial_scripts/learner.py, a stand-in for train.py with
its learning-rate constants and shape whose val_bpb is a pure function of the rates: the
starting train.py (SLOW, tiny rates) learns almost nothing, and a change restoring the
rates (GOOD) improves it by several bits per byte, whatever the load of the machine. Real
training through the loop is tested where the model is the point (REAL_TRAIN, test_loop).
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from helpers.git import TRAIN_PY, git

BUDGET = "2"
TIMEOUT = "25"  # hard limit: the stand-in sleeps 2 s; start-up on a loaded machine takes the rest


def set_constants(source: str, **values) -> str:
    for name, value in values.items():
        source, n = re.subn(rf"^{name} = [^#\n]*", f"{name} = {value} ", source, count=1, flags=re.M)
        assert n == 1, name
    return source


GOOD = (Path(__file__).parent.parent / "trial_scripts" / "learner.py").read_text()
SLOW = set_constants(GOOD, MATRIX_LR="0.0004", EMBED_LR="0.003", HEAD_LR="0.0001")
# GOOD's learning rates as NAME=VALUE arguments: the fake agents restore them in SLOW.
LRS = {name: re.search(rf"^{name} = (\S+)", GOOD, re.M).group(1) for name in ("MATRIX_LR", "EMBED_LR", "HEAD_LR")}
LR_ARGS = " ".join(f"{name}={value}" for name, value in LRS.items())
REAL_TRAIN = TRAIN_PY.read_text()   # the real model: only where training itself is under test


def queue_dir(repo: Path) -> Path:
    queue = repo / "results" / "queue"
    queue.mkdir(parents=True, exist_ok=True)
    return queue


def queue_file(repo: Path, name: str, source: str, description: str) -> None:
    """A whole-file replacement of train.py in the queue."""
    (queue_dir(repo) / name).write_text(f"# autoloop: {description}\n{source}")


def queue_patch(repo: Path, name: str, old: str, new: str, description: str) -> None:
    """A unified diff of train.py in the queue: a change of some lines, which `git apply` puts on
    whatever best the trial starts from (a whole-file .py replaces every line)."""
    diff = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                "a/train.py", "b/train.py")
    (queue_dir(repo) / name).write_text(f"{description}\n\n" + "".join(diff))


def night_queue(repo: Path) -> None:
    queue_file(repo, "01_good.py", GOOD, "restore learning rates")
    queue_file(repo, "02_worse.py", set_constants(GOOD, HEAD_LR="0.0", EMBED_LR="0.0", MATRIX_LR="0.0"),
               "freeze every weight")
    queue_file(repo, "03_typo.py", GOOD.replace("lr_multiplier(progress)", "lr_multiplyer(progress)", 1),
               "typo in the schedule")
    queue_file(repo, "04_nan.py", set_constants(GOOD, MATRIX_LR="float('nan')"), "nan learning rate")
    queue_file(repo, "05_hang.py", GOOD.replace("def main():\n", "def main():\n    while True:\n        pass\n", 1),
               "spin forever")


def with_defaults(args: tuple[str, ...]) -> tuple[str, ...]:
    if args and args[0] in ("run", "trial") and "--noise-runs" not in args:
        # The existing end-to-end tests count ledger rows of a night without noise runs;
        # tests/test_noise.py covers them.
        args = (*args, "--noise-runs", "0")
    if args and args[0] in ("run", "trial") and "--sanity-bound" not in args:
        # Nor the sanity re-run of large gains (GOOD beats SLOW by far more than 10 %);
        # tests/test_integrity.py covers it.
        args = (*args, "--sanity-bound", "0")
    if args and args[0] in ("run", "trial") and not {"--machine-probe", "--no-machine-probe"} & set(args):
        # Nor the machine probe (about a second per attempt); tests/test_machine_speed.py covers it.
        args = (*args, "--no-machine-probe")
    return args


def loop_env(data_dir: Path, env: dict | None = None) -> dict[str, str]:
    """What autoloop() adds to the environment: the test's data, the CPU, and env."""
    return {"AUTOLOOP_DATA_DIR": str(data_dir), "AUTOLOOP_DEVICE": "cpu", **(env or {})}


def autoloop(repo: Path, *args: str, data_dir: Path, check: bool = False, timeout: float = 300,
             env: dict | None = None, own_group: bool = False) -> subprocess.CompletedProcess:
    """Run the CLI; own_group: in a process group of its own, as a shell starts a job (so that
    a Ctrl-C to that group, sent as a terminal does, reaches the CLI and its helpers alone)."""
    cmd = [sys.executable, "-m", "autoloop.cli", *with_defaults(args)]
    full_env = {**os.environ, **loop_env(data_dir, env)}
    proc = subprocess.run(cmd, cwd=repo, env=full_env, capture_output=True, text=True, timeout=timeout,
                          start_new_session=own_group)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def autoloop_in_process(repo: Path, *args: str, data_dir: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """autoloop() without a new Python: autoloop.cli.main.main() called here, in repo, with the
    same arguments and environment, its sys.stdout and sys.stderr captured. It saves the start-up
    and the imports (about a second a call), for tests where the CLI process is not under test.

    Not for a run that is to be killed or signalled (AUTOLOOP_FAULT_KILL_AT would kill pytest),
    and the output is what main() printed, not what its children wrote to the descriptors they
    inherit. What a night changes process-wide must be put back when main() returns: the
    SIGINT/SIGTERM handlers (graceful_signals) and its threads are checked here."""
    full_env = loop_env(data_dir, env)
    assert "AUTOLOOP_FAULT_KILL_AT" not in full_env, "a kill point would kill this process: use autoloop()"
    from autoloop.cli.main import main

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    threads = set(threading.enumerate())
    saved_env, cwd = {name: os.environ.get(name) for name in full_env}, os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.update(full_env)
        os.chdir(repo)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(with_defaults(args)))
            except SystemExit as e:   # argparse's usage errors
                code = e.code if isinstance(e.code, int) else 1
    finally:
        os.chdir(cwd)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    for thread in set(threading.enumerate()) - threads:
        thread.join(10)
        assert not thread.is_alive(), f"autoloop left a thread running: {thread.name}"
    return subprocess.CompletedProcess(["autoloop", *args], code, out.getvalue(), err.getvalue())


def run_args(tag: str = "t") -> list[str]:
    return ["run", "--budget", BUDGET, "--timeout", TIMEOUT, "--proposer", "queue", "--tag", tag,
            "--device", "cpu"]


def read_tsv(repo: Path) -> list[dict]:
    lines = (repo / "results" / "results.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


def read_ledger(repo: Path) -> list[dict]:
    return [json.loads(line) for line in (repo / "results" / "ledger.jsonl").read_text().splitlines()]


def assert_invariants(repo: Path, tag: str = "t") -> list[dict]:
    """HEAD is the best commit, the tree is clean, every trial commit is reachable,
    ledger and TSV agree, no attempt is recorded twice, no trial process is left."""
    ledger = read_ledger(repo)
    best = [r["best"] for r in ledger if r["best"]][-1]
    assert git(repo, "rev-parse", "HEAD") == best
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD") == f"autoloop/{tag}"
    assert git(repo, "status", "--porcelain") == ""
    refs = git(repo, "for-each-ref", "--format=%(objectname)", f"refs/autoloop/{tag}/trials").split()
    for record in ledger:
        if record["commit"]:
            assert record["commit"] in refs, record
            git(repo, "cat-file", "-e", record["commit"])
    keys = [(r["trial"], r["attempt"]) for r in ledger]
    assert len(keys) == len(set(keys)), keys
    tsv = read_tsv(repo)
    judged = [r for r in ledger if r["status"] not in ("skip", "ended") and r["kind"] != "verify"]   # the TSV's rows
    assert len(tsv) == len(judged)
    for row, record in zip(tsv, judged, strict=True):
        # a pruned run reads discard in the TSV (autoresearch's three words), its description says pruned
        assert row["status"] == ("discard" if record["status"] == "pruned" else record["status"])
        assert row["crash"] == (record["crash"] or "-")
        assert row["commit"] == (record["commit"] or "-")[:7]
        label = str(record["trial"]) + (f".{record['attempt']}" if record["attempt"] > 1 else "")
        assert row["trial"] == label
    kept = [r for r in ledger if r["status"] == "keep"]
    for record in kept:   # every kept commit is on the branch
        assert git(repo, "merge-base", "--is-ancestor", record["commit"], "HEAD") == ""
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if p.info["cmdline"] and any(str(repo) in part for part in p.info["cmdline"][1:2])
                 and p.pid != os.getpid()]
    assert not leftovers, leftovers
    return ledger
