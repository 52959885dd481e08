"""Parallel workers (`autoloop run --workers 2`) end to end: real CLI, real git worktrees,
real trial processes, real kill -9.

The trial is a fake train.py (a foreign --command, metric on stdout) whose val_bpb is a
function of its constants, so every verdict is known in advance. Finishing order is forced
without timing: a candidate with WAIT_FOR set does not print its metric until a record
whose description contains WAIT_FOR is in the ledger (another worker's trial recorded).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.git import git, init_repo
from helpers.loop import assert_invariants, autoloop, autoloop_in_process, read_ledger, read_tsv

FAKE = '''\
A = 1.0
# -- A above, B below: separate lines, so that changes to each merge cleanly --

B = 1.0
# ---------------------------------------------------------------------------

CLASH = 0.0
# ---------------------------------------------------------------------------

WAIT_FOR = ""
# ---------------------------------------------------------------------------

import json, os, pathlib, time

if WAIT_FOR:
    # Hold the metric back until another worker's trial is recorded: forces the finishing
    # order without any timing assumption (60 s is only a safety net).
    ledger = pathlib.Path(os.environ["AUTOLOOP_RESULT"]).parent.parent / "ledger.jsonl"
    give_up = time.time() + 60
    while time.time() < give_up:
        if ledger.exists() and any(WAIT_FOR in json.loads(line).get("description", "")
                                   for line in ledger.read_text().splitlines() if line.strip()):
            break
        time.sleep(0.05)
print(f"val_bpb: {A + B + CLASH * (A < 1):.6f}")
'''


def fake(**values) -> str:
    text = FAKE
    for name, value in values.items():
        text, n = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", text, count=1, flags=re.M)
        assert n == 1
    return text


def queue(repo: Path, name: str, source: str) -> None:
    """A whole-file replacement, described by its name ('01_lower_a.py' -> 'lower a'): no
    '# autoloop:' header line, which two candidates would each add and so conflict on."""
    folder = repo / "results" / "queue"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(source)


def args(*extra: str, tag: str = "t") -> list[str]:
    return ["run", "--budget", "1", "--timeout", "60", "--proposer", "queue", "--tag", tag, "--device", "cpu",
            "--command", f"{sys.executable} train.py", "--workers", "2", *extra]


@pytest.fixture
def repo(tmp_path) -> Path:
    return init_repo(tmp_path / "repo", {"train.py": FAKE})


def check_worker_invariants(repo: Path, queued: list[str] | None, tag: str = "t") -> list[dict]:
    """The single loop's invariants, adapted to workers, plus: no queued change lost or run
    twice, the best only ever improves along the ledger, the worker column agrees."""
    ledger = assert_invariants(repo, tag)   # HEAD at best, clean tree, refs, no duplicate, ledger = TSV
    # every queued change proposed exactly once (first attempts; replays carry the source too)
    # (an attempt a kill interrupted is recorded from the state file, which has no source)
    sources = [r["extra"].get("source") for r in ledger if r["attempt"] == 1 and r["kind"] != "baseline"
               and "orchestrator stopped" not in r["reason"]]
    if queued is not None:
        assert sorted(sources) == sorted(queued), sources
        assert not [p for p in (repo / "results" / "queue").glob("*.py")]
    # the best only improves, in ledger order
    metrics = [r["best_metric"] for r in ledger if r["best"]]
    assert metrics == sorted(metrics, reverse=True), metrics
    # the worker column agrees with the ledger
    judged = [r for r in ledger if r["status"] != "skip"]
    for row, record in zip(read_tsv(repo), judged, strict=True):
        assert row["worker"] == ("-" if record["worker"] is None else str(record["worker"]))
    assert ledger[0]["kind"] == "baseline" and ledger[0]["worker"] is None
    assert all(r["worker"] in (0, 1) for r in ledger[1:])
    # the workers' worktrees and branches are gone after a clean stop
    assert not list((repo / "worktrees").glob("w*"))
    assert f"autoloop/{tag}-w" not in git(repo, "branch", "--list")
    assert not list((repo / "results").glob("state-w*.json"))
    return ledger


def by_source(ledger: list[dict], name: str) -> list[dict]:
    return [r for r in ledger if r["extra"].get("source") == name]


def test_a_slower_winner_is_replayed_on_the_new_best_and_wins_again(repo, tiny_data_dir):
    queue(repo, "01_lower_a.py", fake(A=0.5, WAIT_FOR="lower b"))      # 1.5, finishes second
    queue(repo, "02_lower_b.py", fake(B=0.7))                          # 1.7, finishes first
    proc = autoloop_in_process(repo, *args(), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no more ideas" in proc.stdout
    ledger = check_worker_invariants(repo, ["01_lower_a.py", "02_lower_b.py"])
    b = by_source(ledger, "02_lower_b.py")
    assert [(r["status"], r["metric"]) for r in b] == [("keep", 1.7)]
    first, replay = by_source(ledger, "01_lower_a.py")
    # beat its start (the baseline) while the best moved to b: recorded, then replayed on b
    assert first["status"] == "discard" and first["metric"] == 1.5 and first["parent"] == ledger[0]["commit"]
    assert first["next"] == "replay" and "replaying" in first["reason"]
    assert first["best"] == b[0]["commit"]
    assert replay["kind"] == "confirm" and replay["trial"] == first["trial"] and replay["attempt"] == 2
    assert replay["extra"]["replay_of"] == first["commit"] and replay["parent"] == b[0]["commit"]
    assert replay["status"] == "keep" and replay["metric"] == pytest.approx(1.2)
    # the replayed commit holds both changes, on top of b
    assert git(repo, "rev-parse", f"{replay['commit']}^") == b[0]["commit"]
    text = git(repo, "show", f"{replay['commit']}:train.py")
    assert "A = 0.5" in text and "B = 0.7" in text
    assert ledger[-1]["best"] == replay["commit"] == git(repo, "rev-parse", "HEAD")
    assert {first["worker"], b[0]["worker"]} == {0, 1}


def test_kill_between_the_replaying_record_and_the_replay_run_is_resumed(repo, tiny_data_dir):
    """kill -9 after the record that says "replaying it there" and before the replay ran:
    --resume runs the replay (the ledger's last word on the trial was next: replay)."""
    queue(repo, "01_lower_a.py", fake(A=0.5, WAIT_FOR="lower b"))      # 1.5, finishes second
    queue(repo, "02_lower_b.py", fake(B=0.7))                          # 1.7, finishes first
    killed = autoloop(repo, *args(), data_dir=tiny_data_dir, env={"AUTOLOOP_FAULT_KILL_AT": "replaying"})
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    [first] = by_source(read_ledger(repo), "01_lower_a.py")
    assert first["next"] == "replay"
    assert [r for r in read_ledger(repo) if r["trial"] == first["trial"]] == [first]   # nothing of the replay ran

    proc = autoloop_in_process(repo, *args("--resume"), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"#{first['trial']}: resuming its replay on" in proc.stdout
    ledger = check_worker_invariants(repo, ["01_lower_a.py", "02_lower_b.py"])
    b = by_source(ledger, "02_lower_b.py")
    again, replay = by_source(ledger, "01_lower_a.py")
    assert again == first
    assert (replay["trial"], replay["attempt"], replay["kind"]) == (first["trial"], 2, "confirm")
    assert replay["extra"]["replay_of"] == first["commit"] and replay["parent"] == b[0]["commit"]
    assert replay["status"] == "keep" and replay["metric"] == pytest.approx(1.2)
    assert ledger[-1]["best"] == replay["commit"] == git(repo, "rev-parse", "HEAD")
    # Resumed once: a further start finds no replay pending.
    again = autoloop_in_process(repo, *args("--resume"), data_dir=tiny_data_dir)
    assert again.returncode == 0 and "resuming its replay" not in again.stdout, again.stdout + again.stderr


def test_a_replay_that_loses_on_the_new_best_is_discarded(repo, tiny_data_dir):
    queue(repo, "01_lower_a.py", fake(A=0.5, WAIT_FOR="lower b"))      # 1.5 alone
    queue(repo, "02_lower_b.py", fake(B=0.7, CLASH=5.0))               # 1.7 alone, 6.2 with a
    proc = autoloop_in_process(repo, *args(), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = check_worker_invariants(repo, ["01_lower_a.py", "02_lower_b.py"])
    b = by_source(ledger, "02_lower_b.py")[0]
    first, replay = by_source(ledger, "01_lower_a.py")
    assert first["next"] == "replay"
    assert replay["kind"] == "confirm" and replay["extra"]["replay_of"] == first["commit"]
    assert replay["status"] == "discard" and replay["metric"] == pytest.approx(6.2)
    assert ledger[-1]["best"] == b["commit"] == git(repo, "rev-parse", "HEAD")


def test_two_candidates_editing_the_same_line_the_later_is_stale(repo, tiny_data_dir):
    queue(repo, "01_lower_a.py", fake(A=0.5, WAIT_FOR="a bit lower"))  # 1.5, finishes second
    queue(repo, "02_a_bit_lower_a.py", fake(A=0.8))                    # 1.8, finishes first
    proc = autoloop_in_process(repo, *args(), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = check_worker_invariants(repo, ["01_lower_a.py", "02_a_bit_lower_a.py"])
    kept = by_source(ledger, "02_a_bit_lower_a.py")
    assert [r["status"] for r in kept] == ["keep"]
    [stale] = by_source(ledger, "01_lower_a.py")   # recorded once, never replayed
    assert stale["status"] == "discard" and stale["reason"].startswith("stale: ")
    assert stale["extra"]["stale"] is True and stale["metric"] == 1.5
    assert stale["best"] == kept[0]["commit"] == git(repo, "rev-parse", "HEAD")
    [row] = [r for r in read_tsv(repo) if r["trial"] == str(stale["trial"])]
    assert row["status"] == "discard" and row["worker"] == str(stale["worker"])


def test_confirmation_re_runs_work_with_workers_and_replays(repo, tiny_data_dir):
    # --sanity-bound 0.1: a gain over 0.2 is re-run before it can be kept (the confirmation
    # path of the noise rule). b (gain 0.1) is kept at once; a (gain 0.5) asks for a re-run,
    # but the best has moved: replayed on b, where its gain (0.5) asks for a re-run again,
    # which it passes with the best unmoved.
    queue(repo, "01_lower_a.py", fake(A=0.5, WAIT_FOR="lower b"))
    queue(repo, "02_lower_b.py", fake(B=0.9))
    proc = autoloop_in_process(repo, *args("--sanity-bound", "0.1"), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = check_worker_invariants(repo, ["01_lower_a.py", "02_lower_b.py"])
    [b] = by_source(ledger, "02_lower_b.py")
    assert b["status"] == "keep" and b["metric"] == 0.9 + 1.0
    first, replay, confirm = by_source(ledger, "01_lower_a.py")
    assert first["next"] == "replay" and "confirm" not in first["extra"]
    assert replay["extra"]["replay_of"] == first["commit"] and replay["status"] == "discard"
    assert replay["next"] == "confirm" and "sanity bound" in replay["reason"]
    assert confirm["kind"] == "confirm" and confirm["commit"] == replay["commit"] and confirm["status"] == "keep"
    assert confirm["metric"] == pytest.approx(1.4) and confirm["extra"]["runs"] == pytest.approx([1.4, 1.4])
    assert [r["attempt"] for r in (first, replay, confirm)] == [1, 2, 3]
    assert git(repo, "rev-parse", "HEAD") == confirm["commit"]


def test_candidates_while_the_best_stays_are_judged_as_usual(repo, tiny_data_dir):
    # Both lose against the baseline: no replay, no stale, plain discards from both workers.
    queue(repo, "01_raise_a.py", fake(A=1.5))
    queue(repo, "02_raise_b.py", fake(B=1.5))
    queue(repo, "03_crash.py", "raise SystemExit(3)\n")
    proc = autoloop_in_process(repo, *args(), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = check_worker_invariants(repo, ["01_raise_a.py", "02_raise_b.py", "03_crash.py"])
    assert sorted(r["status"] for r in ledger[1:]) == ["crash", "discard", "discard"]
    assert all(r["next"] is None and "replay_of" not in r["extra"] and "stale" not in r["extra"] for r in ledger)
    assert git(repo, "rev-parse", "HEAD") == ledger[0]["commit"]


def wait_for(proc: subprocess.Popen, repo: Path, description: str, recorded_source: str) -> None:
    """Read the orchestrator's output until the trial `description` is training and the
    change `recorded_source` is in the ledger (no timing: the run says so itself)."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        records = read_ledger(repo) if (repo / "results" / "ledger.jsonl").exists() else []
        waiting = any(description in seen_line and "training" in seen_line for seen_line in seen)
        if waiting and any(r["extra"].get("source") == recorded_source for r in records):
            return
    pytest.fail("".join(seen))


def start(repo: Path, tiny_data_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(tiny_data_dir), "AUTOLOOP_DEVICE": "cpu"}
    cmd = [sys.executable, "-m", "autoloop.cli", *args("--noise-runs", "0", "--sanity-bound", "0")]
    # A process group of its own, as a shell starts a job: a terminal's Ctrl-C goes to the group.
    return subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def test_sigint_stops_both_workers_cleanly(repo, tiny_data_dir):
    queue(repo, "01_lower_a.py", fake(A=0.5, WAIT_FOR="never recorded"))   # holds until stopped
    queue(repo, "02_lower_b.py", fake(B=0.7))
    proc = start(repo, tiny_data_dir)
    wait_for(proc, repo, "lower a", "02_lower_b.py")
    os.killpg(proc.pid, signal.SIGINT)   # Ctrl-C: the whole foreground group, git's helpers too
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out
    ledger = check_worker_invariants(repo, ["01_lower_a.py", "02_lower_b.py"])
    [stopped] = by_source(ledger, "01_lower_a.py")
    assert stopped["status"] == "crash" and "SIGINT" in stopped["reason"]
    assert by_source(ledger, "02_lower_b.py")[0]["status"] == "keep"
    status = autoloop(repo, "status", data_dir=tiny_data_dir, check=True).stdout
    assert "stopped: stopped by SIGINT" in status


HELD = """\
import os, pathlib, time
# Held while the test's hold file exists, for the run of seed HOLD_SEED alone: the baseline
# (seed 42) or its first noise run (43). No timing: the test ends the hold itself.
HOLD_FILE, HOLD_SEED = {hold!r}, {seed!r}
if os.environ["AUTOLOOP_SEED"] == HOLD_SEED:
    give_up = time.time() + 60
    while pathlib.Path(HOLD_FILE).exists() and time.time() < give_up:
        time.sleep(0.05)
print("val_bpb: 1.000000")
"""


@pytest.mark.parametrize("held, phase", [("42", "baseline"), ("43", "confirm")])
def test_sigint_before_the_workers_start_ends_the_night_and_resume_goes_on(tmp_path, tiny_data_dir, held, phase):
    """Ctrl-C while the baseline or a noise run trains, before the workers' worktrees exist:
    exit 130, the run recorded as interrupted, and --resume goes on from there (it was an
    internal error: 'workers start after the baseline', exit 70)."""
    hold = tmp_path / "hold"
    hold.touch()
    repo = init_repo(tmp_path / "repo", {"train.py": HELD.format(hold=str(hold), seed=held)})
    queue(repo, "01_lower_a.py", fake(A=0.5))
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(tiny_data_dir), "AUTOLOOP_DEVICE": "cpu"}
    night = args("--noise-runs", "1", "--sanity-bound", "0", "--no-machine-probe")
    proc = subprocess.Popen([sys.executable, "-m", "autoloop.cli", *night], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:   # the held run is training: the run says so itself
        seen.append(line)
        if "training" in line and ("#0 baseline:" if phase == "baseline" else "#0.2 confirm:") in line:
            break
    else:
        pytest.fail("".join(seen))
    os.killpg(proc.pid, signal.SIGINT)   # Ctrl-C: the whole foreground group
    out = "".join(seen) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out
    assert "internal error" not in out and "stopped: stopped by SIGINT" in out, out
    [interrupted] = [r for r in read_ledger(repo) if r["status"] == "crash"]
    assert interrupted["kind"] == phase and "SIGINT" in interrupted["reason"], interrupted
    assert not list((repo / "worktrees").glob("w*"))
    hold.unlink()
    resumed = autoloop_in_process(repo, *night, "--resume", data_dir=tiny_data_dir)
    assert resumed.returncode == 0 and "no more ideas" in resumed.stdout, resumed.stdout + resumed.stderr
    ledger = assert_invariants(repo)   # HEAD at the best, a clean tree, the refs, ledger = TSV
    [candidate] = [r for r in ledger if r["kind"] == "candidate"]
    assert candidate["extra"]["source"] == "01_lower_a.py" and candidate["worker"] in (0, 1), candidate
    assert not list((repo / "worktrees").glob("w*"))
    assert ledger[0] == interrupted if phase == "baseline" else ledger[1] == interrupted


def test_mutate_with_two_workers_never_tries_one_move_twice_on_one_best(repo, tiny_data_dir):
    proc = autoloop_in_process(repo, *[a if a != "queue" else "mutate" for a in args("--max-trials", "6")],
                               data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reached --max-trials 6" in proc.stdout
    ledger = check_worker_invariants(repo, None)
    moves = [(r["parent"], r["description"]) for r in ledger if r["kind"] == "candidate"]
    assert len({t for t in moves}) == len(moves) == 6, moves
    assert {r["worker"] for r in ledger[1:]} == {0, 1}


def test_kill_9_with_two_workers_in_flight_then_resume(repo, tiny_data_dir):
    queue(repo, "01_lower_a.py", fake(A=0.5, WAIT_FOR="never recorded"))   # holds until killed
    queue(repo, "02_lower_b.py", fake(B=0.7))
    queue(repo, "03_lower_b_a_little.py", fake(B=0.9))
    proc = start(repo, tiny_data_dir)
    # One worker holds the waiting trial, the other has recorded a trial of its own: kill -9.
    wait_for(proc, repo, "lower a", "02_lower_b.py")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    states = {p.name: json.loads(p.read_text()) for p in (repo / "results").glob("state-w*.json")}
    assert any(s["phase"] not in ("idle", "stopped") for s in states.values()), states
    status = autoloop(repo, "status", data_dir=tiny_data_dir)
    assert status.returncode == 0 and "interrupted w" in status.stdout, status.stdout + status.stderr
    # Without --resume: refused in one line.
    refused = autoloop(repo, *args(), data_dir=tiny_data_dir)
    assert refused.returncode == 1 and "--resume" in refused.stderr and "Traceback" not in refused.stderr

    # The subject is the recovery: a re-run of "lower a" would wait for its hard timeout.
    proc = autoloop_in_process(repo, *args("--resume", "--no-rerun-interrupted"), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "recovery" in proc.stdout
    ledger = check_worker_invariants(repo, None)
    # every queued change claimed once and run at most once (03 may have been in flight too)
    assert not list((repo / "results" / "queue").glob("*.py"))
    assert len(list((repo / "results" / "queue" / "done").glob("*.py"))) == 3
    sources = [r["extra"]["source"] for r in ledger if r["attempt"] == 1 and r["extra"].get("source")]
    assert len(sources) == len(set(sources)) and "02_lower_b.py" in sources, sources
    described = {r["description"] for r in ledger if r["attempt"] == 1}
    assert {"lower a", "lower b"} <= described, described
    [interrupted] = [r for r in ledger if "interrupted" in r["reason"] and r["description"] == "lower a"]
    assert interrupted["status"] == "crash" and interrupted["attempt"] == 1 and interrupted["worker"] in (0, 1)
    # its candidate is kept under its trial ref, and carries the change
    ref = f"refs/autoloop/t/trials/{interrupted['trial']}-{interrupted['attempt']}"
    assert "A = 0.5" in git(repo, "show", f"{ref}:train.py")
    # the trial process the kill orphaned was ended by the recovery
    assert not [line for line in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
                .splitlines() if str(repo) in line]


def test_kill_9_between_a_keep_and_the_branch_move_then_resume(repo, tiny_data_dir):
    queue(repo, "01_lower_a.py", fake(A=0.5))
    queue(repo, "02_lower_b.py", fake(B=0.7))
    queue(repo, "03_lower_b_a_little.py", fake(B=0.9))
    killed = autoloop(repo, *args(), data_dir=tiny_data_dir, env={"AUTOLOOP_FAULT_KILL_AT": "recorded:1"})
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    proc = autoloop_in_process(repo, *args("--resume"), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = check_worker_invariants(repo, None)
    # each queued change claimed once, run at most once; what the kill interrupted is recorded
    assert not list((repo / "results" / "queue").glob("*.py"))
    assert sorted(p.name for p in (repo / "results" / "queue" / "done").glob("*.py")) == [
        "01_lower_a.py", "02_lower_b.py", "03_lower_b_a_little.py"]
    sources = [r["extra"]["source"] for r in ledger if r["attempt"] == 1 and r["extra"].get("source")]
    assert len(sources) == len(set(sources)), sources
    recovered = [r for r in ledger if "orchestrator stopped" in r["reason"]]
    assert len(recovered) <= 2
    assert "recovery" in proc.stdout


def test_an_agent_works_in_its_worker_worktree(repo, tiny_data_dir):
    # The fake agent edits ./train.py: a worker's agent must run in that worker's worktree
    # (an edit of the main checkout would leave the worktree unchanged: a skip, and a dirty tree).
    agent = Path(__file__).resolve().parent / "fake_agents" / "improve.py"
    argv = [a for a in args("--max-trials", "2") if a not in ("--proposer", "queue")]
    proc = autoloop_in_process(repo, *argv, "--proposer", "agent", "--agent-cmd", f"{sys.executable} {agent} A=0.5",
                               data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = check_worker_invariants(repo, None)
    kept = [r for r in ledger[1:] if r["status"] == "keep"]
    assert len(kept) == 1 and "A = 0.5" in git(repo, "show", f"{kept[0]['commit']}:train.py")
    for r in ledger[1:]:
        if r is not kept[0]:
            # the same edit again: already in the best, or no change on top of it
            assert r["reason"].startswith("stale: ") or "no change" in r["reason"], r


# ---------------------------------------------------------------------------------------------
# devices and settings (no trials)


def test_worker_devices(monkeypatch):
    from autoloop.config.settings import Settings
    from autoloop.core.errors import NightError
    from autoloop.execution.devices import worker_envs

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    envs, why = worker_envs(Settings(workers=2, devices=[3, 5]), 2)
    assert envs == [{"CUDA_VISIBLE_DEVICES": "3", "AUTOLOOP_DEVICE": "cuda"},
                    {"CUDA_VISIBLE_DEVICES": "5", "AUTOLOOP_DEVICE": "cuda"}]
    envs, why = worker_envs(Settings(workers=2), 2, cuda_count=8)   # enough GPUs: one each
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1"] and "one GPU per worker" in why
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    envs, why = worker_envs(Settings(workers=4), 4, cuda_count=2)   # too few: all on the CPU, cores shared
    assert envs == [{"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4", "AUTOLOOP_DEVICE": "cpu",
                     "CUDA_VISIBLE_DEVICES": ""}] * 4
    assert "share 16 CPU cores, 4 thread(s) per trial" in why and "2 GPU(s) visible" in why
    with pytest.raises(NightError, match="needs 2 CUDA devices, 1 visible"):
        worker_envs(Settings(workers=2, device="cuda"), 2, cuda_count=1)


@pytest.mark.parametrize("flags, message", [
    (["--workers", "2", "--devices", "0"], "1 listed for 2 workers"),
    (["--workers", "2", "--devices", "0,0"], "listed twice"),
    (["--workers", "2", "--devices", "gpu0,gpu1"], "CUDA device numbers"),
    (["--workers", "0"], "--workers: must be at least 1, got 0"),
])
def test_bad_worker_flags_are_one_line_errors(repo, tiny_data_dir, flags, message):
    proc = autoloop(repo, "run", "--tag", "t", *flags, data_dir=tiny_data_dir)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    # one error line (argparse's usage lines before it for a malformed flag), no traceback
    assert "Traceback" not in proc.stderr and message in proc.stderr.strip().splitlines()[-1]
    assert not (repo / "results" / "ledger.jsonl").exists()
