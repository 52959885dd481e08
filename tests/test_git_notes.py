"""Git notes (refs/notes/autoloop) on every trial commit: written as the night runs (real CLI,
real git), readable with `git log --notes=autoloop`, brought up to date after a kill -9 and
--resume, and safe whatever an agent wrote in a description."""

from __future__ import annotations

import os
import subprocess

from helpers.git import git
from helpers.loop import read_ledger
from helpers.night import build_night, realistic_steps
from helpers.watch import cli_env, fake, fake_repo, queue, run_args, run_night

from autoloop.observe.git_notes import NOTES_REF, Notes, attempt_block, blob_sha, notes_by_commit
from autoloop.store.ledger import LedgerRecord


def note(repo, commit: str) -> str:
    return subprocess.run(["git", "notes", "--ref", NOTES_REF, "show", commit], cwd=repo, capture_output=True,
                          text=True, check=True).stdout


def label(r: dict) -> str:
    return f"#{r['trial']}" + (f".{r['attempt']}" if r["attempt"] > 1 else "")


def test_each_trial_commit_gets_its_note_as_the_night_runs(tmp_path, tiny_data_dir):
    repo = fake_repo(tmp_path)
    queue(repo, "01_lower_a.py", fake(A=0.5), "lower a")
    queue(repo, "02_raise_b.py", fake(A=0.5, B=3.0), "raise b")
    queue(repo, "03_typo.py", fake(A=0.5).replace('print("---")', 'print("---"'), "typo")
    proc = run_night(repo, tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = read_ledger(repo)
    assert [r["status"] for r in ledger] == ["keep", "keep", "discard", "crash"]
    for r in ledger:
        text = note(repo, r["commit"])
        assert text.startswith(f"{label(r)} {r['status']}"), text
        metric = "-" if r["metric"] is None else f"{r['metric']:.6f}"
        assert f"\nmetric: val_bpb {metric}\n" in text and f"\ncrash: {r['crash'] or '-'}\n" in text
        assert "\nconfidence: -\n" in text and f"\nreason: {r['reason']}" in text
    # The story of the branch, in git alone: the kept commits with their verdicts.
    story = git(repo, "log", "--notes=autoloop", "--format=%h %s%n%N", "autoloop/t")
    assert "#1 keep 2.5000 (-0.5000) lower a" in story and "#0 keep 3.0000 baseline" in story
    assert "#2" not in story                     # discarded: not on the branch, but under its trial ref
    trial_ref = f"refs/autoloop/t/trials/{ledger[2]['trial']}-1"
    assert "#2 discard 3.5000 (+1.0000) raise b" in git(repo, "log", "-1", "--notes=autoloop", trial_ref)
    crash = note(repo, ledger[3]["commit"])
    assert crash.startswith("#3 crash (trivial) typo: SyntaxError") and "\ncrash: trivial\n" in crash
    assert git(repo, "status", "--porcelain") == ""


def test_notes_follow_recovery_after_kill_9(tmp_path, tiny_data_dir):
    repo = fake_repo(tmp_path)
    queue(repo, "01_lower_a.py", fake(A=0.5), "lower a")
    queue(repo, "02_raise_b.py", fake(A=0.5, B=3.0), "raise b")
    proc = run_night(repo, tiny_data_dir, env={"AUTOLOOP_FAULT_KILL_AT": "running:2"})
    assert proc.returncode == -9, proc.stdout + proc.stderr
    # A note lost to another kill (between a record and its note): the next start writes it.
    first = read_ledger(repo)[1]
    git(repo, "notes", "--ref", NOTES_REF, "remove", first["commit"])
    proc = run_night(repo, tiny_data_dir, "--resume")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "notes: wrote 2 git note(s) the ledger had ahead of refs/notes/autoloop" in proc.stdout
    ledger = read_ledger(repo)
    interrupted = next(r for r in ledger if r["trial"] == 2)
    assert "interrupted" in interrupted["reason"]
    text = note(repo, interrupted["commit"])
    assert text.startswith("#2 crash (fundamental) raise b: interrupted (orchestrator stopped during running)")
    assert note(repo, first["commit"]).startswith("#1 keep")
    # Everything the ledger names has exactly the note the ledger says.
    notes = Notes(repo)
    from autoloop.store.ledger import Ledger

    records = Ledger(repo / "results").records()
    assert {c: blob_sha(t) for c, t in notes_by_commit(records).items()} == \
        {c: b for c, b in notes.existing().items() if c in notes_by_commit(records)}
    assert notes.catch_up(records) == 0     # nothing left to write


def test_a_commit_run_several_times_has_one_block_per_attempt_and_text_stays_in_shape(tmp_path):
    night = build_night(tmp_path, realistic_steps()[:3])
    records = list(night.records)
    base = records[0]
    hostile = "line one\nline two\x1b[31m red \x07 <b>bold</b>"
    records.append(LedgerRecord(trial=0, attempt=2, kind="confirm", started_at=base.ended_at,
                                ended_at=base.ended_at + 1, proposer="-", parent=base.commit, commit=base.commit,
                                description=hostile,
                                status="keep", reason="noise sample 1/1\nsecond line", metric=1.0270, noise=0.0005,
                                best=base.commit, best_metric=1.02725, extra={"noise_samples": [1.0275, 1.027]}))
    text = notes_by_commit(records)[base.commit]
    blocks = text.rstrip("\n").split("\n\n")
    assert [b.splitlines()[0][:18] for b in blocks] == ["#0 keep 1.0275 bas", "#0.2 noise sample "]
    second = blocks[1].splitlines()
    assert second[0] == "#0.2 noise sample 1.0270 (+0.0036, 7.2σ) line one line two red <b>bold</b>"
    assert all("\x1b" not in line and "\x07" not in line for line in second)
    assert "reason: noise sample 1/1 second line" in second and "kind: confirm" in second
    assert blob_sha(text) == subprocess.run(["git", "hash-object", "--stdin"], input=text, capture_output=True,
                                            text=True, check=True).stdout.strip()
    assert attempt_block(records[1], 1.0275).splitlines()[1:4] == ["metric: val_bpb 1.023400", "confidence: -",
                                                                   "crash: -"]


def test_notes_are_written_without_a_git_identity(tmp_path, tiny_data_dir):
    repo = fake_repo(tmp_path)
    git(repo, "config", "--unset", "user.name")
    git(repo, "config", "--unset", "user.email")
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "XDG_CONFIG_HOME": str(home),
           "EMAIL": "", "GIT_AUTHOR_NAME": "", "GIT_COMMITTER_NAME": ""}
    env = {k: v for k, v in env.items() if v} | {"PATH": os.environ["PATH"]}
    queue(repo, "01_lower_a.py", fake(A=0.5), "lower a")
    proc = subprocess.run(run_args(), cwd=repo, env={**cli_env(tiny_data_dir), **env}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning" not in proc.stdout
    for r in read_ledger(repo):
        assert note(repo, r["commit"]).startswith(label(r))


def test_parallel_workers_share_one_notes_ref(tmp_path, tiny_data_dir):
    repo = fake_repo(tmp_path)
    queue(repo, "01_lower_a.py", fake(A=0.5), "lower a")
    queue(repo, "02_raise_b.py", fake(B=3.0), "raise b")
    queue(repo, "03_lower_b.py", fake(B=1.5), "lower b")
    proc = run_night(repo, tiny_data_dir, "--workers", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning" not in proc.stdout, proc.stdout
    ledger = read_ledger(repo)
    assert len(ledger) >= 4 and {r["worker"] for r in ledger[1:]} <= {0, 1}
    for r in ledger:
        text = note(repo, r["commit"])
        block = next(b for b in text.split("\n\n") if b.startswith(f"{label(r)} "))
        assert f"\ncrash: {r['crash'] or '-'}" in block
        if r["worker"] is not None:
            assert f"\nworker: {r['worker']}" in block
