"""The single loop and `--workers 1` are one engine: the same queue of patches gives the same
ledger, trial for trial, attempt for attempt (timestamps and durations aside).

The trial is a fake train.py (a foreign --command, its val_bpb a function of its constants),
so every verdict is known in advance; the queue walks through each kind of attempt the
engine makes: a keep, a discard, a trivial crash, a patch that does not apply (a skip), a
sanity-bound confirmation re-run, and the noise samples of the baseline.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers.git import git, init_repo
from helpers.loop import assert_invariants, autoloop, autoloop_in_process, read_tsv

FAKE = '''\
A = 1.0

B = 1.0

print(f"val_bpb: {A + B:.6f}")
'''

# Fields that measure time (or depend on when the run happened): not part of what the engine decides.
TIMING = {"started_at", "ended_at", "elapsed_s", "wall_seconds", "training_seconds", "total_seconds", "memory_gb"}


def queue(repo: Path) -> None:
    folder = repo / "results" / "queue"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "01_lower_a.py").write_text(FAKE.replace("A = 1.0", "A = 0.9"))        # keep
    (folder / "02_raise_b.py").write_text(FAKE.replace("B = 1.0", "B = 1.5"))        # discard
    (folder / "03_typo.py").write_text(FAKE.replace("A + B", "A + C"))               # crash: NameError, trivial
    (folder / "04_stale.patch").write_text("--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-Q = 1\n+Q = 2\n")  # skip
    (folder / "05_much_lower_b.py").write_text(FAKE.replace("A = 1.0", "A = 0.9").replace("B = 1.0", "B = 0.5"))
    (folder / "06_lower_a_more.py").write_text(FAKE.replace("A = 1.0", "A = 0.85").replace("B = 1.0", "B = 0.5"))


def night(tmp_path: Path, name: str, data_dir: Path, *flags: str) -> Path:
    repo = init_repo(tmp_path / name, {"train.py": FAKE})
    queue(repo)
    proc = autoloop_in_process(repo, "run", "--budget", "1", "--timeout", "60", "--proposer", "queue", "--tag", "t",
                               "--device", "cpu", "--command", f"{sys.executable} train.py", "--noise-runs", "1",
                               "--sanity-bound", "0.2", *flags, data_dir=data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "has no more ideas" in proc.stdout
    return repo


def comparable(repo: Path) -> list[dict]:
    """The ledger with timings dropped and every commit named by the train.py it holds (two
    repositories never share commit ids: authors' clocks differ)."""
    def content(sha: str | None) -> str | None:
        return None if sha is None else git(repo, "show", f"{sha}:train.py")

    out = []
    for record in assert_invariants(repo):
        # The hash chain covers each line's bytes, clocks and commit ids included: never equal.
        row = {k: v for k, v in record.items() if k not in TIMING and k != "chain"}
        row["extra"] = {k: v for k, v in row["extra"].items() if k != "propose_seconds"}   # a timing too
        row["commit"], row["parent"], row["best"] = (content(record[k]) for k in ("commit", "parent", "best"))
        out.append(row)
    return out


def test_the_single_loop_and_one_worker_are_the_same_engine(tmp_path, tiny_data_dir):
    single = night(tmp_path, "single", tiny_data_dir)
    one = night(tmp_path, "one-worker", tiny_data_dir, "--workers", "1")
    a, b = comparable(single), comparable(one)
    assert len(a) == len(b) and a == b
    # The night went through every kind of attempt the engine makes, and only one slot ran it.
    kinds = {(r["kind"], r["status"], r["crash"]) for r in a}
    assert {("baseline", "keep", None), ("confirm", "keep", None), ("candidate", "keep", None),
            ("candidate", "discard", None), ("candidate", "crash", "trivial"), ("candidate", "skip", None)} <= kinds
    assert [r["next"] for r in a].count("confirm") == 1 and all(r["worker"] is None for r in a)
    def table(repo: Path) -> list[dict]:   # results.tsv without the columns named by clocks
        return [{k: v for k, v in row.items() if k not in ("commit", "seconds")} for row in read_tsv(repo)]

    assert table(single) == table(one) and len(table(single)) == len([r for r in a if r["status"] != "skip"])
    assert not (one / "worktrees").exists() and not list((one / "results").glob("state-w*.json"))


@pytest.mark.parametrize("flags", [(), ("--workers", "1")])
def test_a_kill_and_resume_is_recovered_the_same_way(tmp_path, tiny_data_dir, flags):
    """Both are one engine for recovery too: a kill while a candidate runs, then --resume."""
    repo = init_repo(tmp_path / "repo", {"train.py": FAKE})
    queue(repo)
    args = ["run", "--budget", "1", "--timeout", "60", "--proposer", "queue", "--tag", "t", "--device", "cpu",
            "--command", f"{sys.executable} train.py", "--noise-runs", "0", "--sanity-bound", "0", *flags]
    killed = autoloop(repo, *args, data_dir=tiny_data_dir, env={"AUTOLOOP_FAULT_KILL_AT": "running:2"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    # The subject is recovery itself: the interrupted attempt stays interrupted (no re-run).
    resumed = autoloop_in_process(repo, *args, "--resume", "--no-rerun-interrupted", data_dir=tiny_data_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    ledger = assert_invariants(repo)
    [interrupted] = [r for r in ledger if r["trial"] == 2]
    assert interrupted["status"] == "crash"
    assert interrupted["reason"] == "interrupted (orchestrator stopped during running)"
    assert interrupted["commit"] and "B = 1.5" in git(repo, "show", f"{interrupted['commit']}:train.py")
