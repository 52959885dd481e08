"""The study across nights end to end: the real CLI in a real git repository, two nights of a
scripted agent (tests/fake_agents/remembering.py, which records every prompt) on a tiny
train.py whose metric is known in advance (a foreign --command printing LR_A + LR_B).

The second night must not train again a change the first measured on the same code, must
show its earlier result to the agent, and its first prompt must name the first night's
failed directions; a night on another budget is not comparable and its numbers stay apart.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.git import git, init_repo
from helpers.loop import autoloop, read_ledger

FAKE = '''\
LR_A = 1.0
# -- one constant per line, so that each change is its own --

LR_B = 1.0
# ---------------------------------------------------------------------------

print(f"val_bpb: {LR_A + LR_B:.6f}")
'''
AGENT = Path(__file__).parent / "fake_agents" / "remembering.py"


@pytest.fixture
def repo(tmp_path) -> Path:
    return init_repo(tmp_path / "repo", {"train.py": FAKE})


def night(repo: Path, data_dir: Path, tag: str, record: Path, *script: str, flags: tuple[str, ...] = ()):
    cmd = f"{sys.executable} {AGENT} {{prompt_file}} {record} {' '.join(script)}"
    return autoloop(repo, "run", "--budget", "1", "--timeout", "60", "--tag", tag, "--device", "cpu",
                    "--command", f"{sys.executable} train.py", "--agent-cmd", cmd, "--skip-preflight",
                    "--lookahead", "0", "--max-trials", str(len(script)), *flags, data_dir=data_dir)


def test_a_second_night_remembers_the_first(repo, tiny_data_dir, tmp_path):
    first = night(repo, tiny_data_dir, "n1", tmp_path / "n1", "1:LR_A=2.0", "2:LR_B=3.0")
    assert first.returncode == 0, first.stdout + first.stderr
    assert [(r["trial"], r["status"]) for r in read_ledger(repo)] == [(0, "keep"), (1, "discard"), (2, "discard")]
    # Nothing kept: the second night starts on the same code (autoloop/n1 is at its baseline).
    second = night(repo, tiny_data_dir, "n2", tmp_path / "n2", "1:LR_A=2.0", "2:LR_A=0.5")
    out = second.stdout + second.stderr
    assert second.returncode == 0, out
    assert "study: 1 earlier comparable night(s) (n1)" in out

    ledger = read_ledger(repo)
    assert [(r["trial"], r["kind"], r["status"]) for r in ledger] == [
        (0, "baseline", "keep"), (1, "candidate", "skip"), (2, "candidate", "keep")]
    skip = ledger[1]
    # Not trained again: no run, its earlier result in the reason, counted as an earlier night's.
    assert skip["extra"]["earlier_night"] == "n1" and skip["extra"]["duplicate_of"] == "n1 #1"
    assert "same change as night n1 #1 on the same code (val_bpb 3.000000, discard" in skip["reason"]
    assert skip["training_seconds"] is None and skip["log_path"] is None
    # The first prompt names the first night's failed directions with their values ...
    first_prompt = (tmp_path / "n2" / "prompt-1.txt").read_text()
    section = first_prompt.split("## Earlier nights of this study", 1)[1]
    assert "night «n1»: 3 attempts, baseline 2.000000, best 2.000000" in section
    assert "- failed LR_A: 1 try 2.0, best +1.000000" in section
    assert "- failed LR_B: 1 try 3.0, best +2.000000" in section
    # ... and the next one shows the earlier result of the change it did not run.
    second_prompt = (tmp_path / "n2" / "prompt-2.txt").read_text()
    assert "## Your previous proposal was not run" in second_prompt and "val_bpb 3.000000, discard" in second_prompt

    status = autoloop(repo, "status", data_dir=tiny_data_dir)
    assert "1 already measured in an earlier night" in status.stdout, status.stdout
    history = json.loads(autoloop(repo, "history", "--json", data_dir=tiny_data_dir, check=True).stdout)
    assert [(n["tag"], n["comparable"], n["best"], n["running_best"]) for n in history["nights"]] == [
        ("n1", True, 2.0, 2.0), ("n2", True, 1.5, 1.5)]
    autoloop(repo, "report", data_dir=tiny_data_dir, check=True)
    report = (repo / "results" / "report.md").read_text()
    assert "## The study across nights" in report and "| n1 |" in report and "![the running best" in report
    assert (repo / "results" / "study.png").stat().st_size > 0


def test_a_night_on_another_budget_is_not_comparable_and_its_change_runs_again(repo, tiny_data_dir, tmp_path):
    first = night(repo, tiny_data_dir, "n1", tmp_path / "n1", "1:LR_A=2.0")
    assert first.returncode == 0, first.stdout + first.stderr
    second = night(repo, tiny_data_dir, "n2", tmp_path / "n2", "1:LR_A=2.0", flags=("--budget", "2"))
    out = second.stdout + second.stderr
    assert second.returncode == 0, out
    assert "study: night n1 not comparable (budget 1s, not 2s): its numbers are kept apart" in out
    # Measured under another budget: the same change is trained again, and not named in the prompt.
    assert [(r["trial"], r["status"]) for r in read_ledger(repo)] == [(0, "keep"), (1, "discard")]
    assert "## Earlier nights of this study" not in (tmp_path / "n2" / "prompt-1.txt").read_text()
    history = json.loads(autoloop(repo, "history", "--json", data_dir=tiny_data_dir, check=True).stdout)
    assert [(n["tag"], n["comparable"], n["not_comparable"], n["running_best"]) for n in history["nights"]] == [
        ("n1", False, ["budget 1s, not 2s"], None), ("n2", True, [], 2.0)]


def test_run_from_starts_on_an_earlier_nights_final_branch_with_a_pinned_lesson(repo, tiny_data_dir, tmp_path):
    first = night(repo, tiny_data_dir, "n1", tmp_path / "n1", "1:LR_A=0.5")
    assert first.returncode == 0, first.stdout + first.stderr
    final = git(repo, "rev-parse", "autoloop/n1")
    git(repo, "checkout", "-q", "main")
    pinned = autoloop(repo, "note", "--pin", "LR_B below 0.5 never helped", data_dir=tiny_data_dir, check=True)
    assert "every later prompt of every later night" in pinned.stdout
    autoloop(repo, "note", "--clear", data_dir=tiny_data_dir, check=True)   # keeps the pinned lesson

    second = night(repo, tiny_data_dir, "n2", tmp_path / "n2", "1:LR_B=0.5", flags=("--from", "n1"))
    out = second.stdout + second.stderr
    assert second.returncode == 0, out
    assert f"from: night n1's final branch autoloop/n1 at {final[:7]}: its kept changes are this night's baseline" \
        in out
    ledger = read_ledger(repo)
    assert ledger[0]["kind"] == "baseline" and ledger[0]["commit"] == final and ledger[0]["metric"] == 1.5
    assert git(repo, "rev-parse", "autoloop/n1") == final   # the earlier night's branch is left as it was
    prompt = (tmp_path / "n2" / "prompt-1.txt").read_text()
    assert "pinned lesson" in prompt and "LR_B below 0.5 never helped" in prompt
    assert "- kept #1 -0.500000 «LR_A 1.0 -> 0.5»" in prompt   # what the first night kept
    history = json.loads(autoloop(repo, "history", "--json", data_dir=tiny_data_dir, check=True).stdout)
    assert [(n["tag"], n["from_tag"], n["branch_exists"]) for n in history["nights"]] == [
        ("n1", None, True), ("n2", "n1", True)]
    refused = night(repo, tiny_data_dir, "n3", tmp_path / "n3", "1:LR_B=0.5", flags=("--from", "nope"))
    assert refused.returncode != 0 and "--from nope: branch autoloop/nope does not exist" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert read_ledger(repo) == ledger   # nothing moved: n2's results are still the live ones
