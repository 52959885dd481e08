"""The duplicate gate (autoloop/duplicate_gate.py, candidate.screen): the same change from
the same best is a skip, told in the next prompt; only a repeat of it counts as a failure.
The end-to-end test runs a real fake agent through the CLI on the scripted train.py."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.loop import BUDGET, assert_invariants, autoloop

from autoloop.core.duplicate_gate import Earlier, changed_constants, normalise, same_as

FAKE = Path(__file__).resolve().parent / "fake_agents"
BASE = "# the learning rate\nLR = 0.04\nDEPTH = 4\n\ndef main():\n    print(LR * DEPTH)\n"


def test_comments_whitespace_and_number_spelling_are_ignored():
    a = BASE.replace("LR = 0.04", "LR = 0.06")
    b = BASE.replace("LR = 0.04", "LR   =  6e-2   # raised").replace("# the learning rate\n", "")
    assert normalise(a) == normalise(b)
    assert normalise(a) != normalise(BASE.replace("LR = 0.04", "LR = 0.07"))
    assert normalise(BASE) != normalise(BASE.replace("DEPTH = 4", "DEPTH = 4.0"))         # an int is not a float
    # indentation is meaning
    assert normalise("if x:\n    a = 1\nb = 2\n") != normalise("if x:\n    a = 1\n    b = 2\n")


def test_same_as_finds_the_earlier_attempt_and_says_which_constants():
    tried = [Earlier("3", BASE.replace("DEPTH = 4", "DEPTH = 5")),
             Earlier("7.2", BASE.replace("LR = 0.04", "LR = 0.06"))]
    candidate = BASE.replace("LR = 0.04", "LR = 0.060  # again")
    assert same_as(candidate, tried).label == "7.2"
    assert same_as(BASE.replace("LR = 0.04", "LR = 0.05"), tried) is None
    assert changed_constants(BASE, candidate) == ["LR = 0.06"]


def test_a_broken_edit_is_compared_by_its_lines():
    broken = "def f(:\n    pass  # oops\n"
    assert same_as("def f(:\n        pass\n", [Earlier("2", broken)]).label == "2"


def test_a_repeated_proposal_is_skipped_untrained_told_and_stops_the_night_when_repeated(baselined_repo,
                                                                                         tiny_data_dir, tmp_path):
    repo, prompts = baselined_repo, tmp_path / "prompts"
    proc = autoloop(repo, "run", "--budget", BUDGET, "--timeout", "60", "--tag", "t", "--device", "cpu", "--resume",
                    "--agent-cmd", f"{FAKE / 'repeat.py'} {prompts} HEAD_LR=0.0", "--max-agent-failures", "1",
                    "--max-trials", "6", data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    rows = [(r["trial"], r["status"], r["reason"].split(" (")[0]) for r in ledger[1:]]
    # 1 runs (and is discarded: a frozen head learns nothing); 2 is the same change spelt
    # otherwise: a skip, forgiven once; 3 repeats it again: a failure, and --max-agent-failures 1 stops.
    assert [(t, s) for t, s, _ in rows] == [(1, "discard"), (2, "skip"), (3, "skip")]
    assert rows[1][2] == rows[2][2] == "same change as #1"
    assert ledger[2]["reason"] == "same change as #1 (HEAD_LR = 0.0, already tried from this best)"
    assert ledger[2]["extra"]["duplicate_of"] == "1" and ledger[2]["commit"] is None
    assert ledger[2]["description"] == "freeze the head (spelt again)"
    assert not (repo / "results" / "runs" / "2-1.log").exists()      # nothing trained
    assert "#2 skipped: same change as #1" in proc.stdout
    # Its CLI reports no usage: said once, never estimated.
    assert proc.stdout.count("agent cost: ") == 1 and "reported no usage at all" in proc.stdout
    state = json.loads((repo / "results" / "state.json").read_text())
    assert state["stop_reason"].startswith("agent failed 1 time in a row (--max-agent-failures 1)")
    # The next prompt says so, first.
    told = (prompts / "3.md").read_text()
    assert "## Your previous proposal was not run" in told
    assert "Trial 2 («freeze the head (spelt again)») was same change as #1" in told
    assert "## Your previous proposal" not in (prompts / "2.md").read_text()


def test_a_fix_that_lands_on_a_change_already_judged_is_not_trained(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    proc = autoloop(repo, "run", "--budget", BUDGET, "--timeout", "60", "--tag", "t", "--device", "cpu", "--resume",
                    "--agent-cmd", f"{FAKE / 'fix_into_repeat.py'} HEAD_LR=0.0", "--max-trials", "2",
                    data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    rows = [(r["trial"], r["attempt"], r["status"], r["crash"]) for r in ledger[1:]]
    assert rows == [(1, 1, "discard", None), (2, 1, "crash", "trivial"), (2, 2, "skip", None)]
    assert ledger[-1]["reason"] == "fix failed: same change as #1 (HEAD_LR = 0.0, already tried from this best)"
    assert not (repo / "results" / "runs" / "2-2.log").exists()
