"""Look-ahead (--lookahead) end to end: the real CLI, a real git repository, a real (scripted) agent
process proposing in the look-ahead worktree while a trial runs, real kill -9.

The trial is a tiny train.py (a foreign --command, metric on stdout: A + B), so every
verdict is known in advance; the agent (tests/fake_agents/scripted.py) edits it by a script
of one edit per trial number. Order is forced without timing: a train.py whose WAIT names a
trial does not finish before that trial's look-ahead candidate is prepared, and then not
for HOLD seconds more.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.git import git, init_repo
from helpers.loop import assert_invariants, autoloop, read_ledger

FAKE = '''\
A = 1.0
# -- A above, B below: separate lines, so that changes to each merge cleanly --

B = 1.0
# ---------------------------------------------------------------------------

WAIT = 0
# ---------------------------------------------------------------------------

HOLD = 0.0
# ---------------------------------------------------------------------------

import pathlib, time

if WAIT:   # held until trial WAIT is prepared: the test's way to order two things without timing
    deadline = time.time() + 60
    while not pathlib.Path(f"results/prepared/{WAIT}.json").exists() and time.time() < deadline:
        time.sleep(0.05)
time.sleep(HOLD)
print(f"val_bpb: {A + B:.6f}")
'''

AGENT = Path(__file__).parent / "fake_agents" / "scripted.py"


@pytest.fixture
def repo(tmp_path) -> Path:
    return init_repo(tmp_path / "repo", {"train.py": FAKE})


def run_args(*script: str, flags: tuple[str, ...] = (), resume: bool = False) -> list[str]:
    cmd = f"{sys.executable} {AGENT} {{prompt_file}} {' '.join(script)}"
    return ["run", "--budget", "1", "--timeout", "60", "--tag", "t", "--device", "cpu",
            "--command", f"{sys.executable} train.py", "--agent-cmd", cmd, "--skip-preflight",
            *(("--resume",) if resume else ()), *flags]


def night(repo: Path, data_dir: Path, *script: str, flags: tuple[str, ...] = (), env: dict | None = None,
          resume: bool = False):
    return autoloop(repo, *run_args(*script, flags=flags, resume=resume), data_dir=data_dir, env=env)


def trials(ledger: list[dict]) -> list[tuple]:
    return [(r["trial"], r["attempt"], r["kind"], r["status"], r["crash"]) for r in ledger]


def test_an_agent_looks_ahead_by_default_and_its_prompt_names_the_trial_in_flight(repo, tiny_data_dir):
    proc = night(repo, tiny_data_dir, "1:A=0.9", "2:B=0.8", flags=("--max-trials", "2"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    assert trials(ledger) == [(0, 1, "baseline", "keep", None), (1, 1, "candidate", "keep", None),
                              (2, 1, "candidate", "keep", None)]
    assert "[ahead] #2 prepared: trial 2: B=0.8" in proc.stdout
    prompt = (repo / "results" / "agents" / "2-1.prompt.md").read_text()
    running = prompt[prompt.index("## Running now"):]   # the digest's section (digest.py)
    assert re.match(r"## Running now[^\n]*\n\n- #1 on [0-9a-f]{7}: «trial 1: A=0.9»\n", running), running[:300]
    # The look-ahead's worktree and state are gone after a clean stop, its file too.
    assert not (repo / "worktrees" / "ahead").exists()
    assert not (repo / "results" / "state-ahead.json").exists()
    assert not list((repo / "results" / "prepared").glob("*"))
    assert all(isinstance(r["extra"].get("propose_seconds"), float) for r in ledger[1:])
    status = autoloop(repo, "status", data_dir=tiny_data_dir, check=True).stdout
    assert re.search(r"^device busy \d+% of \S+ this run; proposer \d+\.\d s per trial$", status, re.M), status
    data = json.loads(autoloop(repo, "status", "--json", data_dir=tiny_data_dir, check=True).stdout)
    assert 0 < data["device_busy"] <= 1 and data["propose_s_per_trial"] > 0
    report = autoloop(repo, "report", data_dir=tiny_data_dir, check=True)
    assert "## Device time" in (repo / "results" / "report.md").read_text(), report.stdout


def test_a_candidate_prepared_before_a_keep_is_merged_and_judged_against_the_new_best(repo, tiny_data_dir):
    proc = night(repo, tiny_data_dir, "1:A=0.9", "2:B=0.8", flags=("--max-trials", "2"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    baseline, first, second = assert_invariants(repo)
    prepared = git(repo, "rev-parse", "refs/autoloop/t/prepared/2")
    # Proposed on the baseline while trial 1 ran ...
    assert git(repo, "rev-parse", f"{prepared}^") == baseline["commit"]
    # ... then merged onto trial 1's keep and judged against it.
    assert second["parent"] == first["commit"] == first["best"]
    assert second["extra"]["lookahead"] == {"prepared": prepared, "prepared_on": baseline["commit"],
                                            "merged_onto": first["commit"]}
    text = git(repo, "show", f"{second['commit']}:train.py")
    assert "A = 0.9" in text and "B = 0.8" in text
    assert second["status"] == "keep" and second["metric"] == pytest.approx(1.7)
    assert "merged onto it" in proc.stdout


# A=(0.95) rewrites the line in another form, not just the constant's value: a real conflict.
@pytest.mark.parametrize("edit, why", [("A=(0.95)", "conflicts with"), ("A=0.9", "is already in")])
def test_a_prepared_change_that_no_longer_fits_goes_back_to_the_proposer(repo, tiny_data_dir, edit, why):
    proc = night(repo, tiny_data_dir, "1:A=0.9", f"2:{edit}", "3:B=0.8", flags=("--max-trials", "3"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    assert trials(ledger) == [(0, 1, "baseline", "keep", None), (1, 1, "candidate", "keep", None),
                              (2, 1, "candidate", "skip", None), (3, 1, "candidate", "keep", None)]
    stale, fresh = ledger[2], ledger[3]
    if edit == "A=0.9" and stale["reason"].startswith("same change as #1"):
        # Trial 1 was recorded before the prepared proposal was screened: the duplicate
        # gate (core/duplicate_gate.py) refuses it at once, before the look-ahead's own check would.
        assert stale["extra"]["duplicate_of"] == "1"
    else:
        assert f"look-ahead: the change prepared on {ledger[0]['commit'][:7]} {why} the new best " \
               f"{ledger[1]['commit'][:7]}; the proposer is asked afresh" == stale["reason"]
        assert stale["extra"]["lookahead"]["prepared"] == git(repo, "rev-parse", "refs/autoloop/t/prepared/2")
    # The fresh request is proposed on the new best: nothing trained on the stale base.
    assert fresh["parent"] == ledger[1]["commit"] and "lookahead" not in fresh["extra"]
    assert (repo / "results" / "agents" / "3-1.prompt.md").exists()


def test_a_prepared_change_of_the_constant_the_keep_moved_is_rebased_onto_the_new_best(repo, tiny_data_dir):
    """Trial 2 (A=0.95) is prepared on the baseline while trial 1 (A=0.9) trains and is kept:
    the lines conflict, but only on the constant both set, so the proposal's value is set on
    the new best and described from there (A 0.9 -> 0.95), instead of going back to the agent."""
    proc = night(repo, tiny_data_dir, "1:A=0.9,B=0.95", "2:A=0.95", flags=("--max-trials", "2"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    baseline, first, second = assert_invariants(repo)
    assert (first["status"], second["kind"], second["status"]) == ("keep", "candidate", "discard"), second["reason"]
    assert second["parent"] == first["commit"]
    assert second["description"] == f"A 0.9 -> 0.95 (re-based onto {first['commit'][:7]}; proposed as: trial 2: A=0.95)"
    assert second["extra"]["lookahead"]["rebased"] == [["A", "0.9", "0.95"]]
    assert second["extra"]["lookahead"]["prepared_on"] == baseline["commit"]
    text = git(repo, "show", f"{second['commit']}:train.py")
    assert "A = 0.95" in text and "B = 0.95" in text   # the keep's other constant stays
    assert second["metric"] == pytest.approx(1.9)
    assert "re-based onto it: A 0.9 -> 0.95" in proc.stdout
    # Only one proposal per trial: the agent was not asked again for trial 2.
    assert len(list((repo / "results" / "agents").glob("2-*.prompt.md"))) == 1


def test_a_trivial_crash_is_fixed_before_the_prepared_candidate_runs(repo, tiny_data_dir):
    proc = night(repo, tiny_data_dir, "1:A=0.9+typo", "2:B=0.8", flags=("--max-trials", "2"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    assert trials(ledger) == [(0, 1, "baseline", "keep", None), (1, 1, "candidate", "crash", "trivial"),
                              (1, 2, "fix", "keep", None), (2, 1, "candidate", "keep", None)]
    fix, second = ledger[2], ledger[3]
    assert second["started_at"] >= fix["ended_at"]
    assert second["parent"] == fix["commit"] and second["metric"] == pytest.approx(1.7)


def test_lookahead_0_proposes_then_trains(repo, tiny_data_dir):
    proc = night(repo, tiny_data_dir, "1:A=0.9", "2:B=0.8", flags=("--max-trials", "2", "--lookahead", "0"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    assert [r["status"] for r in ledger] == ["keep"] * 3
    assert all("lookahead" not in r["extra"] for r in ledger)
    assert "prepared" not in proc.stdout and not (repo / "worktrees").exists()


def test_bad_lookahead_value_is_one_line(repo, tiny_data_dir):
    proc = night(repo, tiny_data_dir, "1:A=0.9", flags=("--lookahead", "2"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "lookahead" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_kill_9_with_one_candidate_prepared_and_another_training_then_resume(repo, tiny_data_dir):
    # Trial 1 trains until trial 2's candidate is prepared, and on; the kill lands right then.
    wait = "WAIT=2,HOLD=30"
    killed = night(repo, tiny_data_dir, f"1:A=0.9,{wait}", "2:B=0.8", "3:A=0.8", flags=("--max-trials", "3"),
                   env={"AUTOLOOP_FAULT_KILL_AT": "prepared:2"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    state = json.loads((repo / "results" / "state.json").read_text())
    assert (state["trial"], state["phase"]) == (1, "running")
    prepared = json.loads((repo / "results" / "prepared" / "2.json").read_text())
    assert prepared["commit"] == git(repo, "rev-parse", "refs/autoloop/t/prepared/2")

    # Its subject is the prepared candidate: trial 1 is not run again (tests/test_leftovers.py).
    resumed = night(repo, tiny_data_dir, "1:A=0.9", "2:B=0.8", "3:A=0.8",
                    flags=("--max-trials", "2", "--no-rerun-interrupted"), resume=True)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    ledger = assert_invariants(repo)   # ledger and TSV agree, nothing twice, no process left
    assert trials(ledger) == [(0, 1, "baseline", "keep", None), (1, 1, "candidate", "crash", "fundamental"),
                              (2, 1, "candidate", "keep", None), (3, 1, "candidate", "keep", None)]
    assert ledger[1]["reason"] == "interrupted (orchestrator stopped during running)"
    # The prepared candidate ran once, as it was (the best had not moved), first after the resume.
    assert ledger[2]["commit"] == prepared["commit"] and ledger[2]["parent"] == ledger[0]["commit"]
    assert f"#2: prepared ahead [{prepared['commit'][:7]}] and not yet run: it runs first" in resumed.stdout
    assert not list((repo / "results" / "prepared").glob("*"))
    assert not (repo / "results" / "state-ahead.json").exists()
    assert not (repo / "worktrees" / "ahead").exists()

    # A resume after that finds nothing more to run twice.
    again = night(repo, tiny_data_dir, "4:A=0.7", flags=("--max-trials", "1", "--no-rerun-interrupted"), resume=True)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [r["trial"] for r in assert_invariants(repo)] == [0, 1, 2, 3, 4]


def test_ctrl_c_with_a_candidate_prepared_keeps_it_for_resume(repo, tiny_data_dir):
    args = run_args("1:A=0.9,WAIT=2,HOLD=30", "2:B=0.8", flags=("--max-trials", "3", "--noise-runs", "0",
                                                                 "--sanity-bound", "0"))
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(tiny_data_dir), "AUTOLOOP_DEVICE": "cpu"}
    proc = subprocess.Popen([sys.executable, "-m", "autoloop.cli", *args], cwd=repo, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    prepared = repo / "results" / "prepared" / "2.json"
    deadline = time.time() + 120
    while not prepared.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert prepared.exists(), proc.communicate()[0]
    os.killpg(proc.pid, signal.SIGINT)   # Ctrl-C: the whole foreground group
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out
    ledger = read_ledger(repo)
    assert trials(ledger)[1:] == [(1, 1, "candidate", "crash", "fundamental")]
    assert "SIGINT" in ledger[1]["reason"] and prepared.exists()
    assert not (repo / "worktrees" / "ahead").exists()   # the candidate is a commit: no worktree needed
    status = autoloop(repo, "status", data_dir=tiny_data_dir, check=True).stdout
    assert "prepared, not yet run: trial 2 (autoloop run --resume runs it first)" in status

    resumed = night(repo, tiny_data_dir, "3:A=0.8", flags=("--max-trials", "2"), resume=True)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    ledger = assert_invariants(repo)
    assert trials(ledger)[2:] == [(2, 1, "candidate", "keep", None), (3, 1, "candidate", "keep", None)]
    assert ledger[2]["commit"] == git(repo, "rev-parse", "refs/autoloop/t/prepared/2")   # as it was prepared
    assert not prepared.exists()


def test_the_first_trial_is_proposed_while_the_noise_samples_run(repo, tiny_data_dir):
    proc = night(repo, tiny_data_dir, "1:A=0.9", flags=("--max-trials", "1", "--noise-runs", "1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    assert trials(ledger) == [(0, 1, "baseline", "keep", None), (0, 2, "confirm", "keep", None),
                              (1, 1, "candidate", "keep", None)]
    assert ledger[2]["extra"]["lookahead"] == {"prepared_on": ledger[0]["commit"]}
    # Asked (its prompt written) before the noise sample ended, not after.
    assert (repo / "results" / "agents" / "1-1.prompt.md").stat().st_mtime < ledger[1]["ended_at"]


def test_each_of_two_workers_looks_ahead(repo, tiny_data_dir):
    # Four trials: each worker reserves its first, then its look-ahead (the fourth reservation
    # reaches --max-trials). Changes to A conflict with each other, to B too: some skips, and
    # each trial number is still proposed once and recorded once.
    proc = night(repo, tiny_data_dir, "1:A=0.9", "2:B=0.8", "3:A=0.8", "4:B=0.7",
                 flags=("--max-trials", "4", "--workers", "2"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    firsts = [r for r in ledger if r["kind"] == "candidate" and r["attempt"] == 1]
    assert sorted(r["trial"] for r in firsts) == [1, 2, 3, 4]
    ahead = [r for r in firsts if "lookahead" in r["extra"]]
    assert sorted(r["worker"] for r in ahead) == [0, 1], [(r["trial"], r["worker"], r["extra"]) for r in firsts]
    assert "[w0 ahead] #" in proc.stdout and "[w1 ahead] #" in proc.stdout
    assert not list((repo / "worktrees").glob("*")) and not list((repo / "results").glob("state-*ahead.json"))
    assert "-ahead" not in git(repo, "branch", "--list")


def test_kill_9_during_the_look_ahead_call_records_it_as_an_interrupted_proposal(repo, tiny_data_dir):
    # Trial 1 trains for 30 s; trial 2's agent call, in the look-ahead worktree, ends first: the kill.
    killed = night(repo, tiny_data_dir, "1:A=0.9,HOLD=30", "2:B=0.8", flags=("--max-trials", "3"),
                   env={"AUTOLOOP_FAULT_KILL_AT": "proposed:2"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    ahead = json.loads((repo / "results" / "state-ahead.json").read_text())
    assert (ahead["trial"], ahead["phase"]) == (2, "proposing")
    refused = night(repo, tiny_data_dir, "3:A=0.8")
    assert refused.returncode != 0 and "pass --resume" in refused.stderr

    resumed = night(repo, tiny_data_dir, "3:A=0.8", flags=("--max-trials", "1", "--no-rerun-interrupted"),
                    resume=True)   # its subject is the look-ahead call: trial 1 is not run again
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    ledger = assert_invariants(repo)
    assert trials(ledger) == [(0, 1, "baseline", "keep", None), (1, 1, "candidate", "crash", "fundamental"),
                              (2, 1, "candidate", "crash", "fundamental"), (3, 1, "candidate", "keep", None)]
    interrupted = ledger[2]
    assert interrupted["reason"] == "interrupted (orchestrator stopped during proposing)"
    assert "B = 0.8" in git(repo, "show", f"{interrupted['commit']}:train.py")   # the agent's edit, kept
    assert not (repo / "results" / "state-ahead.json").exists()
