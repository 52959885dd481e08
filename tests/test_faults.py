"""Fault injection: the real loop (CLI, git, ledger, runner) through one misbehaviour at a time.

Each row of FAULTS is one misbehaviour of train.py or of the agent. Its test copies a
repo whose baseline is already recorded, makes the misbehaviour happen for real (the
queue proposer proposes a misbehaving train.py, or a fake agent from tests/fake_agents/
misbehaves), runs `autoloop run --resume`, and checks the ledger row it must end in
(status, crash class, a reason substring) and the invariants: HEAD at the best commit, a
clean tree, every trial reachable, ledger and results.tsv agree, no process left.

The train.py here is a fake (milliseconds, `val_bpb: X` on stdout), run as a foreign
`--command` (stdout is the metric) or, in the "result" night, as the default command,
where the result file with the run's nonce is required (runner.require_result). So the
whole table runs in about a minute; the slow cases are the timeouts themselves.

To add a misbehaviour: one Fault(...) row. A misbehaviour the code does not handle yet
goes in with `pending=` (a strict xfail naming what should happen), so its fix flips it.

Covered elsewhere, at other levels, and not repeated here:
  tests/test_runner.py   each trial script through run_process and classify alone
  tests/test_loop.py     real torch training: a night; SIGKILL at every phase (fault points);
                         external SIGKILL mid-training; SIGINT/SIGTERM to the orchestrator
  tests/test_agent.py    an agent's trivial crash handed back as a fix request and fixed
  tests/test_noise.py    a kill during a confirmation re-run
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from helpers.git import git, init_repo
from helpers.loop import assert_invariants, autoloop, queue_file, read_ledger, read_tsv

from autoloop.execution import cgroups

SCRIPTS = Path(__file__).parent / "trial_scripts"
AGENTS = Path(__file__).parent / "fake_agents"
PY = shlex.quote(sys.executable)

# The fake train.py: its metric is a function of LR (an agent raising LR improves it).
STDOUT_TRAIN = '''"""Fake train.py of tests/test_faults.py: val_bpb on stdout."""
LR = 0.001
print("step 00001 | loss: 5.0")
print("---")
print(f"val_bpb: {1.5 - LR:.6f}")
'''

# As train.py under the harness reports: the result file with the run's nonce, and stdout.
RESULT_TRAIN = '''"""Fake train.py of tests/test_faults.py: the result file as autoloop.evaluate writes it."""
import json
import os

LR = 0.001
value = 1.5 - LR
with open(os.environ["AUTOLOOP_RESULT"], "w") as f:
    json.dump({"metric": "val_bpb", "val_bpb": value, "nonce": os.environ["AUTOLOOP_NONCE"]}, f)
print("---")
print(f"val_bpb: {value:.6f}")
'''

NIGHTS = {
    "stdout": (STDOUT_TRAIN, ["--command", f"{PY} train.py"]),
    "result": (RESULT_TRAIN, []),
}
RUN = ["run", "--budget", "1", "--timeout", "20", "--tag", "t", "--device", "cpu"]


def script(name: str) -> str:
    return (SCRIPTS / name).read_text()


def result_train(file: str | None, stdout: str | None) -> str:
    """A train.py that writes `file` (a JSON text; {nonce} is the run's) as its result and
    prints `stdout` as its val_bpb; None: not at all."""
    lines = ["import json, os"]
    if file is not None:
        lines.append(f"text = {file!r}.replace('{{nonce}}', os.environ['AUTOLOOP_NONCE'])")
        lines.append("open(os.environ['AUTOLOOP_RESULT'], 'w').write(text)")
    if stdout is not None:
        lines.append(f"print('---'); print('val_bpb: {stdout}')")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ the table

# The queue writes a proposal with its '# autoloop: <description>' line on top, so a line
# number in train.py is one more than in the script it came from.


@dataclass(frozen=True)
class Fault:
    id: str
    status: str                     # the ledger row: keep | discard | crash | skip
    crash: str | None = None        # trivial | fundamental | timeout
    reason: str | None = None       # a substring of the row's reason
    train: str | None = None        # a train.py the queue proposes (whole-file replacement)
    agent: str | None = None        # --agent-cmd; {tmp} is the test's tmp dir
    night: str = "stdout"           # stdout: a foreign --command; result: the result file is required
    args: tuple[str, ...] = ()      # more flags for the run
    orchestrator_killed: bool = False   # the misbehaviour SIGKILLs the orchestrator: --resume after it
    exit_status: int = 0            # the run's exit status (130/143: stopped by SIGINT/SIGTERM)
    check: Callable[[Path, dict, Path], None] | None = None   # more assertions (repo, row, tmp)
    pending: str | None = None      # not handled yet: a strict xfail saying what should happen


def pid_dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def pids_in(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()]


def daemon_ended(repo: Path, row: dict, tmp: Path) -> None:
    pids = pids_in(repo / "results" / "fault.pid")
    assert pids and all(map(pid_dead, pids)), pids


def agent_processes_ended(repo: Path, row: dict, tmp: Path) -> None:
    pids = pids_in(tmp / "pids")
    assert pids and all(map(pid_dead, pids)), pids


def agent_daemon_ended(repo: Path, row: dict, tmp: Path) -> None:
    agent_processes_ended(repo, row, tmp)
    # Killed before it could write: the kept commit is the agent's edit alone.
    assert "behind the loop's back" not in git(repo, "show", f"{row['commit']}:train.py")


def outside_quarantined(repo: Path, row: dict, tmp: Path) -> None:
    assert row["outside_changes"] == ["helper.py"]
    assert not (repo / "helper.py").exists()
    assert (repo / "results" / "quarantine" / "1-1" / "helper.py").exists()
    assert git(repo, "show", "--name-only", "--format=", row["commit"]) == "train.py"


def flood_read(repo: Path, row: dict, tmp: Path) -> None:
    assert row["metric"] == pytest.approx(1.75)
    log = repo / "results" / row["log_path"]
    assert log.stat().st_size <= 32 * 2**20 + 4096 and row["extra"]["log_cut_bytes"] > 160 * 2**20   # capped
    with open(log, "rb") as f:
        f.seek(-4096, os.SEEK_END)
        assert b"val_bpb: 1.75" in f.read()                         # the tail survives the cap


def run_writes_put_back(repo: Path, row: dict, tmp: Path) -> None:
    assert row["extra"]["run_wrote"] == ["notes.md"]
    assert (repo / "notes.md").read_text() == "notes\n"
    assert (repo / "results" / "quarantine" / "1-1" / "run" / "notes.md").read_text().endswith("edited by train.py\n")


def metric_not_taken(repo: Path, row: dict, tmp: Path) -> None:
    assert row["metric"] is None and "val_bpb: 0.5" in (repo / "results" / row["log_path"]).read_text()


def stopped_by_sigterm(repo: Path, row: dict, tmp: Path) -> None:
    state = json.loads((repo / "results" / "state.json").read_text())
    assert state["stop_reason"] == "stopped by SIGTERM"
    assert all(map(pid_dead, pids_in(repo / "results" / "fault.pid")))


DAEMON_TRAIN = '''import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open("results/fault.pid.tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace("results/fault.pid.tmp", "results/fault.pid")
        time.sleep(60)
    os._exit(0)
while not os.path.exists("results/fault.pid"):
    time.sleep(0.01)
print("val_bpb: 1.25")
'''

# Kills the process that started it (the orchestrator), then keeps training.
KILL_PARENT_TRAIN = '''import os, signal, time
with open("results/fault.pid", "w") as f:
    f.write(str(os.getpid()))
os.kill(os.getppid(), signal.SIG{sig})
time.sleep(30)
print("val_bpb: 0.5")
'''

# Ctrl-C in a terminal: SIGINT to the orchestrator's whole process group (the terminal's
# foreground group: the orchestrator and every helper it started there), then trains on.
CTRL_C_TRAIN = '''import os, signal, time
with open("results/fault.pid", "w") as f:
    f.write(str(os.getpid()))
os.killpg(os.getpgid(os.getppid()), signal.SIGINT)
time.sleep(30)
print("val_bpb: 0.5")
'''


# setsid, a double fork, an empty environment: beyond session, token and tree tracking.
ESCAPING_TRAIN = f'''import subprocess, sys
subprocess.run([sys.executable, {str(SCRIPTS / "escaping_daemon.py")!r}, "results/fault.pid"], check=True)
print("val_bpb: 1.25")
'''
CONTAINED = cgroups.containment()[0] is not None


def stopped_by_sigint(repo: Path, row: dict, tmp: Path) -> None:
    state = json.loads((repo / "results" / "state.json").read_text())
    assert state["stop_reason"] == "stopped by SIGINT"
    assert all(map(pid_dead, pids_in(repo / "results" / "fault.pid")))


FAULTS = [
    # -- train.py fails: the edit is to blame (trivial: a fixing proposer gets the traceback)
    Fault("syntax-error", "crash", "trivial", "SyntaxError: invalid syntax (train.py:5)",
          train=script("syntax_error.py")),
    Fault("indentation-error", "crash", "trivial", "IndentationError: unexpected indent (train.py:4)",
          train=script("indentation_error.py")),
    Fault("name-error", "crash", "trivial", "NameError: name 'lr' is not defined (train.py:6)",
          train=script("name_error.py")),
    Fault("import-error", "crash", "trivial", "ModuleNotFoundError: No module named 'autoloop_no_such_module'",
          train=script("import_error.py")),
    Fault("attribute-error", "crash", "trivial", "AttributeError: module 'math' has no attribute 'tau2'",
          train=script("attribute_error.py")),
    Fault("type-error", "crash", "trivial", "TypeError: object of type 'int' has no len() (train.py:3)",
          train=script("type_error.py")),
    Fault("shape-mismatch", "crash", "trivial",
          "shape mismatch: RuntimeError: mat1 and mat2 shapes cannot be multiplied",
          train=script("shape_mismatch.py")),
    Fault("value-error", "crash", "trivial", "ValueError: too many values to unpack (expected 2) (train.py:3)",
          train='print("step 00001 | loss: 5.0")\nheads, dim = (4, 3, 2)\n'),
    Fault("exit-0-no-metric", "crash", "trivial", "no val_bpb reported", train=script("exit0_no_metric.py")),
    # -- train.py fails: the idea (or the machine) is to blame
    Fault("nan-metric-exit-0", "crash", "fundamental", "val_bpb is nan", train='print("---")\nprint("val_bpb: nan")\n'),
    Fault("fail-line-nan-loss", "crash", "fundamental", "FAIL: loss is nan at step 3", train=script("nan_fail.py")),
    Fault("nonzero-exit-no-traceback", "crash", "fundamental", "unclassified: giving up",
          train='import sys\nprint("giving up")\nsys.exit(2)\n'),
    Fault("segfault", "crash", "fundamental", "killed by SIGSEGV", train=script("segfault.py")),
    Fault("sigkill-like-oom-killer", "crash", "fundamental", "killed by SIGKILL (likely the host out-of-memory killer)",
          train='import os, signal\nprint("step 00001 | loss: 5.0", flush=True)\n'
                'os.kill(os.getpid(), signal.SIGKILL)\n'),
    Fault("memory-hog", "crash", "fundamental", "host memory cap 0.25 GiB exceeded", train=script("memory_hog.py"),
          args=("--max-rss-gb", "0.25")),
    # -- train.py does not end by itself
    Fault("infinite-loop", "crash", "timeout", "hard timeout 3 s exceeded", train=script("infinite_loop.py"),
          args=("--timeout", "3")),
    Fault("ignores-sigterm-at-timeout", "crash", "timeout", "hard timeout 3 s exceeded",
          train=script("ignores_sigterm.py"), args=("--timeout", "3")),
    Fault("metric-then-hang", "crash", "timeout", "hard timeout 3 s exceeded",
          train='import time\nprint("val_bpb: 0.5", flush=True)\ntime.sleep(60)\n', args=("--timeout", "3"),
          check=metric_not_taken),
    # -- train.py leaves things behind, or floods
    Fault("setsid-daemon-grandchild", "keep", None, "improved", train=DAEMON_TRAIN, check=daemon_ended),
    Fault("daemon-escapes-session-token-and-tree", "keep", None, "improved", train=ESCAPING_TRAIN, check=daemon_ended,
          pending=None if CONTAINED else f"no writable cgroup here ({cgroups.containment()[1]}): it escapes"),
    Fault("stdout-flood", "discard", None, None, train=script("flood.py"), check=flood_read),
    # -- train.py turns on the orchestrator
    Fault("sigterms-the-orchestrator", "crash", "fundamental", "interrupted (SIGTERM)",
          train=KILL_PARENT_TRAIN.format(sig="TERM"), exit_status=143, check=stopped_by_sigterm),
    Fault("ctrl-c-in-a-terminal", "crash", "fundamental", "interrupted (SIGINT)", train=CTRL_C_TRAIN,
          exit_status=130, check=stopped_by_sigint),
    Fault("sigkills-the-orchestrator", "crash", "fundamental", "interrupted (orchestrator stopped during running)",
          train=KILL_PARENT_TRAIN.format(sig="KILL"), orchestrator_killed=True, check=daemon_ended),
    # -- train.py's report cannot be trusted (train.py under the harness: the result file is required)
    Fault("exit-0-without-result-file", "crash", "trivial", "no val_bpb reported", night="result",
          train="import sys\nprint('step 00001 | loss: 5.0')\nsys.exit(0)\n"),
    Fault("stdout-metric-without-result-file", "crash", "fundamental", "no result file from autoloop.evaluate",
          night="result", train=result_train(None, "0.5")),
    Fault("result-file-wrong-nonce", "crash", "fundamental", "result nonce mismatch", night="result",
          train=result_train('{"metric": "val_bpb", "val_bpb": 0.5, "nonce": "0123456789abcdef"}', "0.5")),
    Fault("result-file-without-nonce", "crash", "fundamental", "result file has no nonce", night="result",
          train=result_train('{"metric": "val_bpb", "val_bpb": 0.5}', "0.5")),
    Fault("stdout-disagrees-with-result-file", "crash", "fundamental",
          "result file val_bpb 1.250000 disagrees with stdout 0.5", night="result",
          train=result_train('{"metric": "val_bpb", "val_bpb": 1.25, "nonce": "{nonce}"}', "0.5")),
    Fault("result-file-unreadable", "crash", "fundamental", "result file unreadable", night="result",
          train=result_train('{"val_bpb": 0.5, ', "0.5")),
    Fault("result-file-nan", "crash", "fundamental", "val_bpb is nan", night="result",
          train=result_train('{"metric": "val_bpb", "val_bpb": NaN, "nonce": "{nonce}"}', None)),
    # -- the agent
    Fault("agent-exits-nonzero", "skip", None, "agent exited with code 3: error: no API key configured",
          agent=str(AGENTS / "fail.py")),
    Fault("agent-hangs-past-timeout", "skip", None, "agent timed out after 2s (process tree killed",
          agent=f"{AGENTS / 'hang.py'} {{tmp}}/pids", args=("--agent-timeout", "2s"),
          check=agent_processes_ended),
    Fault("agent-makes-no-change", "skip", None, "agent made no change to train.py",
          agent=str(AGENTS / "no_change.py")),
    Fault("agent-killed-by-signal", "skip", None, "agent killed by SIGKILL", agent="sh -c 'kill -9 $$'"),
    Fault("agent-edits-outside-train-py", "keep", None, "improved", agent=f"{AGENTS / 'outside_edit.py'} LR=0.5",
          check=outside_quarantined),
    Fault("agent-leaves-a-daemon", "keep", None, "improved", agent=f"{AGENTS / 'leave_daemon.py'} {{tmp}}/pids LR=0.5",
          check=agent_daemon_ended),
    # -- the run writes into the repository: put back, kept in quarantine, recorded
    Fault("kept-trial-edits-a-tracked-file", "keep", None, None,
          train='open("notes.md", "a").write("edited by train.py\\n")\nprint("val_bpb: 0.5")\n',
          check=run_writes_put_back),
]


# ------------------------------------------------------------------------------ running one


def trial_processes(repo: Path) -> list[str]:
    """Live processes (zombies aside) whose command line, working directory or AUTOLOOP_*
    environment points into the repo: what a trial, an agent or their children would be."""
    root, found = str(repo), []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            hit = (any(root in part for part in proc.info["cmdline"] or []) or proc.cwd().startswith(root)
                   or any(k.startswith("AUTOLOOP_") and root in v for k, v in proc.environ().items()))
        except psutil.Error:
            continue
        if hit:
            found.append(f"{proc.pid}: {' '.join(proc.info['cmdline'] or [])[:100]}")
    return found


@pytest.fixture(scope="session")
def night_templates(tmp_path_factory, tiny_data_dir) -> dict[str, Path]:
    """One repo per night on branch autoloop/t with its baseline recorded."""
    templates = {}
    for night, (train, args) in NIGHTS.items():
        repo = init_repo(tmp_path_factory.mktemp(f"faults-{night}") / "repo",
                         {"train.py": train, "notes.md": "notes\n"})
        proc = autoloop(repo, *RUN, *args, "--proposer", "queue", data_dir=tiny_data_dir)
        assert proc.returncode == 0 and "no more ideas" in proc.stdout, proc.stdout + proc.stderr
        templates[night] = repo
    return templates


def params():
    for fault in FAULTS:
        marks = [pytest.mark.xfail(strict=True, reason=fault.pending)] if fault.pending else []
        yield pytest.param(fault, id=fault.id, marks=marks)


@pytest.mark.parametrize("fault", params())
def test_fault(fault: Fault, night_templates, tiny_data_dir, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(night_templates[fault.night], repo, symlinks=True)
    baseline = read_ledger(repo)
    args = [*RUN, *NIGHTS[fault.night][1], "--resume"]
    if fault.agent:
        args += ["--proposer", "agent", "--agent-cmd", fault.agent.replace("{tmp}", str(tmp_path)),
                 "--max-trials", "1", "--max-agent-failures", "1"]
    else:
        queue_file(repo, "01_fault.py", fault.train, fault.id)
        args += ["--proposer", "queue"]
    args += fault.args

    # In a process group of its own, as a shell starts a job: a group signal stays in it.
    proc = autoloop(repo, *args, data_dir=tiny_data_dir, timeout=120, own_group=True)
    if fault.orchestrator_killed:
        assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
        # Its subject is the recovery: a re-run of that train.py would kill the orchestrator
        # again (tests/test_leftovers.py has the re-runs).
        proc = autoloop(repo, *args, "--no-rerun-interrupted", data_dir=tiny_data_dir, timeout=120)
    assert proc.returncode == fault.exit_status, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and "internal error" not in proc.stderr

    ledger = assert_invariants(repo)
    assert not trial_processes(repo)
    new = ledger[len(baseline):]
    assert len(new) == 1, new   # one misbehaviour, one row: nothing lost, nothing twice
    row = new[0]
    assert (row["trial"], row["attempt"], row["status"], row["crash"]) == (1, 1, fault.status, fault.crash), row
    if fault.reason:
        assert fault.reason in row["reason"], row["reason"]
    assert "\n" not in row["reason"]
    if fault.status != "skip":
        assert row["commit"] and read_tsv(repo)[-1]["trial"] == "1"
    if fault.check:
        fault.check(repo, row, tmp_path)


def test_ctrl_c_during_the_baseline_is_a_stop_not_a_failed_baseline(tmp_path, tiny_data_dir):
    """Ctrl-C while the baseline trains (the first minutes of every night): a stop (130),
    the baseline recorded as interrupted, not "the baseline failed" (exit 1)."""
    repo = init_repo(tmp_path / "repo", {"train.py": CTRL_C_TRAIN})
    proc = autoloop(repo, *RUN, *NIGHTS["stdout"][1], "--proposer", "queue", data_dir=tiny_data_dir,
                    timeout=120, own_group=True)
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert proc.stderr == "" and "stopped: stopped by SIGINT" in proc.stdout, proc.stdout + proc.stderr
    [baseline] = read_ledger(repo)
    assert (baseline["kind"], baseline["status"], baseline["reason"]) == ("baseline", "crash", "interrupted (SIGINT)")
    assert git(repo, "status", "--porcelain") == ""


def test_the_table_names_enough_distinct_misbehaviours():
    ids = [f.id for f in FAULTS]
    assert len(ids) == len(set(ids))
    assert len([f for f in FAULTS if not f.pending]) >= 20
    assert all((f.train is None) != (f.agent is None) for f in FAULTS)


# ------------------------------------------------------------------------------ recovery (soak findings)

# A train.py with a worker process (as a data loader has) and a setsid daemon, writing
# their pids and its own to results/fault.pid, then training for a minute.
WORKERS_TRAIN = '''import os, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
pids = [os.getpid(), worker.pid]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(120)
    os._exit(0)
time.sleep(0.5)
with open("results/fault.pid.tmp", "w") as f:
    f.write(" ".join(map(str, pids)))
os.replace("results/fault.pid.tmp", "results/fault.pid")
time.sleep(60)
print("val_bpb: 0.5")
'''


def daemon_pids_of(token_holder: int) -> list[int]:
    """Processes carrying the same trial token as `token_holder` (its setsid daemon too)."""
    token = psutil.Process(token_holder).environ()["AUTOLOOP_TRIAL_TOKEN"]
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("AUTOLOOP_TRIAL_TOKEN") == token:
                found.append(proc.pid)
        except psutil.Error:
            pass
    return found


def start_and_kill_mid_trial(repo: Path, data_dir: Path, forget_pids: bool) -> list[int]:
    """`autoloop run --resume` on WORKERS_TRAIN; SIGKILL the orchestrator alone once the
    trial's processes are up; return their pids (all alive, orphaned). forget_pids: clear
    state.json's child_pids, as a kill between the trial's start and its state save leaves it."""
    queue_file(repo, "01_workers.py", WORKERS_TRAIN, "workers")
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(data_dir), "AUTOLOOP_DEVICE": "cpu"}
    proc = subprocess.Popen([sys.executable, "-m", "autoloop.cli", *RUN, *NIGHTS["stdout"][1], "--resume",
                             "--proposer", "queue", "--noise-runs", "0"], cwd=repo, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file = repo / "results" / "fault.pid"
    deadline = time.time() + 60
    while not pid_file.exists():
        assert time.time() < deadline and proc.poll() is None, "the trial never started"
        time.sleep(0.05)
    pids = daemon_pids_of(pids_in(pid_file)[0])
    proc.kill()
    proc.wait()
    assert len(pids) == 3 and not any(map(pid_dead, pids)), pids   # main, worker, daemon: orphaned, running
    if forget_pids:
        state_file = repo / "results" / "state.json"
        state = json.loads(state_file.read_text())
        assert state["phase"] == "running" and state["child_pids"]
        state_file.write_text(json.dumps({**state, "child_pids": []}))
    return pids


@pytest.mark.parametrize("forget_pids", [False, True], ids=["pids-in-state", "killed-before-pids-saved"])
def test_recovery_ends_every_process_of_the_orphaned_trial(night_templates, tiny_data_dir, tmp_path, forget_pids):
    """Soak finding: recovery ended the trial's main process only, so its workers (and a
    daemon) ran on; and a kill before state.json named the main process left all of it."""
    repo = tmp_path / "repo"
    shutil.copytree(night_templates["stdout"], repo, symlinks=True)
    pids = start_and_kill_mid_trial(repo, tiny_data_dir, forget_pids)
    try:
        resumed = autoloop(repo, *RUN, *NIGHTS["stdout"][1], "--resume", "--proposer", "queue",
                           "--no-rerun-interrupted", data_dir=tiny_data_dir, timeout=120)   # its subject: recovery
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert "recovery: ended 3 process(es)" in resumed.stdout
        assert all(map(pid_dead, pids)), [p for p in pids if not pid_dead(p)]
        ledger = assert_invariants(repo)
        assert not trial_processes(repo)
        assert ledger[-1]["reason"] == "interrupted (orchestrator stopped during running)"
    finally:
        for pid in pids:
            if not pid_dead(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not CONTAINED, reason="no writable cgroup on this machine")
def test_recovery_ends_a_daemon_that_escaped_everything_but_its_cgroup(night_templates, tiny_data_dir, tmp_path):
    """kill -9 of the orchestrator mid-trial, then the trial's main process ends too: what is
    left is a daemon with no session, token or parent of ours. --resume ends it through the
    run's cgroup, found by the token state.json recorded before the run."""
    repo = tmp_path / "repo"
    shutil.copytree(night_templates["stdout"], repo, symlinks=True)
    train = ESCAPING_TRAIN.replace('print("val_bpb: 1.25")', 'import time; time.sleep(60)')
    queue_file(repo, "01_escape.py", train, "escape")
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(tiny_data_dir), "AUTOLOOP_DEVICE": "cpu"}
    proc = subprocess.Popen([sys.executable, "-m", "autoloop.cli", *RUN, *NIGHTS["stdout"][1], "--resume",
                             "--proposer", "queue", "--noise-runs", "0"], cwd=repo, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    pid_file = repo / "results" / "fault.pid"
    deadline = time.time() + 60
    while not pid_file.exists():
        assert time.time() < deadline and proc.poll() is None, "the trial never started"
        time.sleep(0.05)
    daemon = pids_in(pid_file)[0]
    state = json.loads((repo / "results" / "state.json").read_text())
    proc.kill()
    proc.wait()
    for pid, _ in state["child_pids"]:      # the trial's main process goes too
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    try:
        assert not pid_dead(daemon) and state["child_token"]
        resumed = autoloop(repo, *RUN, *NIGHTS["stdout"][1], "--resume", "--no-rerun-interrupted",
                           "--proposer", "queue", data_dir=tiny_data_dir, timeout=120)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert pid_dead(daemon), "the escaped daemon outlived the recovery"
        assert "recovery: ended" in resumed.stdout
        assert_invariants(repo)
    finally:
        if not pid_dead(daemon):
            os.kill(daemon, signal.SIGKILL)


def test_recovery_sets_untracked_files_aside_never_deletes_them(night_templates, tiny_data_dir, tmp_path):
    """After a kill -9, a file nobody committed (the person's, written while the loop was
    down, or the run's) is moved to the attempt's quarantine by --resume, not deleted by
    the reset to the best."""
    repo = tmp_path / "repo"
    shutil.copytree(night_templates["stdout"], repo, symlinks=True)
    pids = start_and_kill_mid_trial(repo, tiny_data_dir, forget_pids=False)
    (repo / "mine").mkdir()
    (repo / "mine" / "notes.txt").write_text("my notes\n")
    try:
        resumed = autoloop(repo, *RUN, *NIGHTS["stdout"][1], "--resume", "--no-rerun-interrupted",
                           "--proposer", "queue", data_dir=tiny_data_dir, timeout=120)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert "recovery: untracked mine/notes.txt set aside in results/quarantine/1-1/recovery/" in resumed.stdout
        assert (repo / "results" / "quarantine" / "1-1" / "recovery" / "mine" / "notes.txt").read_text() == "my notes\n"
        assert not (repo / "mine").exists()
        assert_invariants(repo)
    finally:
        for pid in pids:
            if not pid_dead(pid):
                os.kill(pid, signal.SIGKILL)


def test_kill_9_during_an_agent_call_puts_back_the_refs_it_moved(night_templates, tiny_data_dir, tmp_path):
    """The agent force-moved a branch and a tag, then the orchestrator was SIGKILLed during
    the call: the refs snapshot persisted before the call lets --resume put them back."""
    repo = tmp_path / "repo"
    shutil.copytree(night_templates["stdout"], repo, symlinks=True)
    git(repo, "tag", "v1", "main")
    main, best = git(repo, "rev-parse", "main"), git(repo, "rev-parse", "HEAD")
    args = [*RUN, *NIGHTS["stdout"][1], "--resume", "--noise-runs", "0"]
    killed = autoloop(repo, *args, "--proposer", "agent",
                      "--agent-cmd", f"{AGENTS / 'git_move_refs_then_kill.py'} LR=0.5",
                      data_dir=tiny_data_dir, timeout=120, own_group=True)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    moved = git(repo, "rev-parse", "main")
    assert moved != main and git(repo, "rev-parse", "v1") == moved   # as the agent left them
    assert (repo / "results" / "agents" / "1-1.refs.json").exists()

    resumed = autoloop(repo, *args, "--proposer", "queue", data_dir=tiny_data_dir, timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert git(repo, "rev-parse", "main") == main and git(repo, "rev-parse", "v1^{commit}") == main
    assert "main" in resumed.stdout and "v1" in resumed.stdout and "restored" in resumed.stdout, resumed.stdout
    ledger = assert_invariants(repo)
    assert ledger[-1]["reason"] == "interrupted (orchestrator stopped during proposing)"
    assert ledger[-1]["commit"] and git(repo, "rev-parse", f"{ledger[-1]['commit']}~1") == best
    assert not (repo / "results" / "agents" / "1-1.refs.json").exists()


def test_recovery_rewrites_a_results_tsv_left_a_row_short(night_templates, tiny_data_dir, tmp_path):
    """Soak finding: a kill between the ledger append and the results.tsv rewrite left the
    table a row short after --resume (nothing rewrote it until the next record)."""
    from autoloop.store.ledger import Ledger, LedgerRecord

    repo = tmp_path / "repo"
    shutil.copytree(night_templates["stdout"], repo, symlinks=True)
    head = git(repo, "rev-parse", "HEAD")
    git(repo, "update-ref", "refs/autoloop/t/trials/1-1", head)
    state_file = repo / "results" / "state.json"
    state = json.loads(state_file.read_text())
    # What the disk holds after that kill: the record of 1.1 appended, the TSV as before,
    # state.json still judging 1.1.
    Ledger(repo / "results").append(LedgerRecord(
        trial=1, attempt=1, started_at=time.time(), ended_at=time.time(), proposer="queue", parent=head,
        commit=head, description="same again", status="discard", metric=1.6, metric_name="val_bpb",
        best=head, best_metric=read_ledger(repo)[-1]["best_metric"]), write_tsv=False)
    state_file.write_text(json.dumps({**state, "phase": "judging", "trial": 1, "attempt": 1, "kind": "candidate",
                                      "best": head, "candidate": head, "child_pids": []}))
    assert len(read_tsv(repo)) == 1

    resumed = autoloop(repo, *RUN, *NIGHTS["stdout"][1], "--resume", "--proposer", "queue", data_dir=tiny_data_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [r["trial"] for r in read_tsv(repo)] == ["0", "1"]
    assert_invariants(repo)


def test_a_refused_tsv_write_leaves_the_kept_record_in_memory_and_the_branch_moved(tmp_path, monkeypatch):
    """The ledger's line is the commit point and results.tsv is derived from it: when the
    disk refuses the TSV after the line is written, the arbiter still holds the record and
    the branch is at its best, so another worker judges against the new best (the chaos
    night kept a change without the one before it, 1 run in 5)."""
    from autoloop.core.keep import Facts, Rules, decide
    from autoloop.engine.arbiter import Arbiter
    from autoloop.repo.workspace import Workspace
    from autoloop.store.ledger import Draft, Ledger

    repo = init_repo(tmp_path / "repo", {"train.py": "LR = 1.0\n"})
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "train.py").write_text("LR = 0.5\n")
    git(repo, "commit", "-qam", "lower lr")
    change = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "reset", "-q", "--hard", base)
    arbiter = Arbiter(Ledger(repo / "results"), Workspace(repo), Rules())
    now = time.time()

    def record(commit: str, kind: str, metric: float) -> None:
        facts = Facts(kind=kind, commit=commit, runs=(metric,), parent=arbiter.best(), current=arbiter.best())
        draft = Draft(trial=0 if kind == "baseline" else 1, kind=kind, started_at=now, ended_at=now, proposer="-",
                      parent=arbiter.best()[0], commit=commit, description=kind, metric=metric)
        arbiter.record(draft, decide(facts), None)

    record(base, "baseline", 1.0)
    monkeypatch.setenv("AUTOLOOP_FAULT_WRITE", "ENOSPC:results.tsv:1")
    with pytest.raises(OSError):
        record(change, "candidate", 0.5)
    assert arbiter.best() == (change, 0.5)
    assert git(repo, "rev-parse", "HEAD").strip() == change
    assert [r.commit for r in Ledger(repo / "results").records()] == [base, change]
