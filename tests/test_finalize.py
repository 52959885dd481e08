"""`autoloop finalize` on nights built by hand in real git repos: a clean branch with one
commit per kept change, the metrics in the messages, and nothing else touched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.git import git
from helpers.night import Step, build_night, realistic_steps, set_values

from autoloop.review.finalize import changed_ranges, commit_message, kept_changes, ranges_overlap


def cli(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoloop.cli", *args], cwd=repo, capture_output=True, text=True,
                          timeout=120)


def snapshot(repo: Path) -> dict:
    """Everything finalize must leave alone."""
    return {
        "head": git(repo, "rev-parse", "--symbolic-full-name", "HEAD"),
        "branch": git(repo, "rev-parse", "refs/heads/autoloop/t"),
        "index": git(repo, "write-tree"),   # the tree the index holds
        "status": git(repo, "status", "--porcelain", "--untracked-files=all"),
        "train": (repo / "train.py").read_text(),
        "trial_refs": git(repo, "for-each-ref", "refs/autoloop"),
    }


@pytest.fixture
def night(tmp_path):
    return build_night(tmp_path, realistic_steps(), tag="t")


def test_finalize_makes_one_commit_per_kept_change(night):
    repo = night.repo
    before = snapshot(repo)
    proc = cli(repo, "finalize")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == \
        f"created autoloop/t-final: 6 commits on top of the baseline {night.baseline[:7]}"
    assert f"its tree equals the best commit {night.best[:7]}" in proc.stdout

    # Same tree as the best commit (under the results commit); starts at the baseline; original
    # branch and work tree untouched.
    assert git(repo, "rev-parse", "autoloop/t-final~1^{tree}") == git(repo, "rev-parse", f"{night.best}^{{tree}}")
    assert git(repo, "merge-base", "autoloop/t-final", night.baseline) == night.baseline
    assert snapshot(repo) == before

    subjects = git(repo, "log", "--reverse", "--format=%s", f"{night.baseline}..autoloop/t-final").splitlines()
    assert subjects == ["MATRIX_LR 0.04 -> 0.06", "weight decay 0 -> 0.1", "warmdown 0.5 -> 0.7", "width 128 -> 160",
                        "HEAD_LR 0.004 -> 0.006", "MATRIX_LR 0.06 -> 0.07",
                        "autoloop results: 29 attempts of autoloop/t"]
    shas = git(repo, "rev-list", "--reverse", f"{night.baseline}..autoloop/t-final~1").split()
    first = git(repo, "log", "-1", "--format=%B", shas[0])
    assert first.startswith("MATRIX_LR 0.04 -> 0.06\n\nval_bpb 1.0275 -> 1.0234 (trial 1)\n")
    kept = [r for r in night.records if r.status == "keep" and r.kind != "baseline"]
    assert f"autoloop-commit: {kept[0].commit}" in first
    assert "val_bpb 1.0168 -> 1.0159 (trial 25)" in git(repo, "log", "-1", "--format=%B", shas[-1])
    # Each commit is exactly its kept change: same tree as the kept commit, one file touched.
    for sha, record in zip(shas, kept, strict=True):
        assert git(repo, "rev-parse", f"{sha}^{{tree}}") == git(repo, "rev-parse", f"{record.commit}^{{tree}}")
        assert git(repo, "diff-tree", "--no-commit-id", "--name-only", "-r", sha) == "train.py"
        assert git(repo, "log", "-1", "--format=%an <%ae>", sha) == "autoloop test <test@autoloop.invalid>"


def test_finalize_refuses_an_existing_branch_and_takes_another_name(night):
    repo = night.repo
    git(repo, "branch", "autoloop/t-final", night.baseline)
    proc = cli(repo, "finalize")
    assert proc.returncode == 1
    assert proc.stderr == ("autoloop: branch autoloop/t-final already exists; pass --branch NAME or delete it "
                           "(git branch -D autoloop/t-final)\n")
    assert git(repo, "rev-parse", "autoloop/t-final") == night.baseline     # not moved
    proc = cli(repo, "finalize", "--branch", "review/lr", "--tag", "t", "--no-results")
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "rev-parse", "review/lr^{tree}") == git(repo, "rev-parse", f"{night.best}^{{tree}}")


def test_finalize_squashes_consecutive_overlapping_changes(tmp_path):
    n = build_night(tmp_path, [
        Step("MATRIX_LR 0.04 -> 0.06", "keep", 1.0234, edit={"MATRIX_LR": "0.06"}),
        Step("width 128 -> 160", "discard", 1.0300, edit={"WIDTH": "160"}),
        Step("MATRIX_LR 0.06 -> 0.07", "keep", 1.0220, edit={"MATRIX_LR": "0.07"}),   # same line again
        Step("depth 4 -> 5", "keep", 1.0200, edit={"DEPTH": "5"}),                   # other lines
        Step("MATRIX_LR 0.07 -> 0.075", "keep", 1.0190, edit={"MATRIX_LR": "0.075"}),  # not next to the others
    ])
    repo = n.repo
    proc = cli(repo, "finalize", "--squash-overlapping", "--no-results")
    assert proc.returncode == 0, proc.stderr
    log = git(repo, "log", "--reverse", "--format=%s", f"{n.baseline}..autoloop/t-final").splitlines()
    assert log == ["MATRIX_LR 0.04 -> 0.06; MATRIX_LR 0.06 -> 0.07", "depth 4 -> 5", "MATRIX_LR 0.07 -> 0.075"]
    squashed = git(repo, "log", "-1", "--format=%B", "autoloop/t-final~2")
    assert "val_bpb 1.0275 -> 1.0220 (trials 1, 3)" in squashed
    assert "- MATRIX_LR 0.04 -> 0.06: val_bpb 1.0275 -> 1.0234 (trial 1)" in squashed
    assert "- MATRIX_LR 0.06 -> 0.07: val_bpb 1.0234 -> 1.0220 (trial 3)" in squashed
    assert git(repo, "rev-parse", "autoloop/t-final^{tree}") == git(repo, "rev-parse", f"{n.best}^{{tree}}")

    # Without the flag every kept change is its own commit.
    proc = cli(repo, "finalize", "--branch", "each")
    assert proc.returncode == 0, proc.stderr
    assert len(git(repo, "rev-list", f"{n.baseline}..each").split()) == 4 + 1   # and the results commit


def test_finalize_errors_are_one_line(tmp_path):
    n = build_night(tmp_path / "a", [Step("idea", "discard", 1.03, edit={"WIDTH": "1"}),
                                     Step("typo", "crash", crash="trivial", reason="NameError", edit={"WIDTH": "x"})])
    proc = cli(n.repo, "finalize")
    assert proc.returncode == 1
    assert proc.stderr == "autoloop: no kept changes in the ledger of tag 't': nothing to finalize\n"
    assert git(n.repo, "branch", "--list", "autoloop/t-final") == ""

    proc = cli(n.repo, "finalize", "--tag", "other")
    assert proc.returncode == 1 and "no ledger of tag 'other'" in proc.stderr and "--tag t" in proc.stderr

    bare = tmp_path / "b"
    bare.mkdir()
    git(bare, "init", "-q")
    proc = cli(bare, "finalize")
    assert proc.returncode == 1
    assert proc.stderr.startswith("autoloop: no ledger at ") and proc.stderr.count("\n") == 1


def test_overlap_and_message_helpers(night):
    old = "a\nb\nc\nd\ne\n"
    first = changed_ranges(old, "a\nB\nc\nd\ne\n")
    assert first == ([(1, 2)], [(1, 2)])
    assert ranges_overlap(first[1], changed_ranges("a\nB\nc\nd\ne\n", "a\nBB\nc\nd\ne\n")[0])
    assert not ranges_overlap(first[1], changed_ranges("a\nB\nc\nd\ne\n", "a\nB\nc\nd\nE\n")[0])
    changes = kept_changes(night.records)
    assert [c.before for c in changes[:2]] == [1.0275, 1.0234]
    assert commit_message(changes[:1]).startswith("MATRIX_LR 0.04 -> 0.06\n\nval_bpb 1.0275 -> 1.0234 (trial 1)\n")


def test_finalize_applies_a_change_built_on_an_older_best(tmp_path):
    """Two kept changes both built on the baseline (as parallel workers would make them):
    the second is applied as a patch on top of the first, and finalize says that the
    result differs from the ledger's best commit (which lacks the first change)."""
    from autoloop.store.ledger import Ledger, LedgerRecord

    n = build_night(tmp_path, [])
    repo = n.repo
    source = (repo / "train.py").read_text()
    commits = []
    for name, value in (("DEPTH", "6"), ("DROPOUT", "0.2")):
        (repo / "train.py").write_text(set_values(source, **{name: value}))
        git(repo, "commit", "-qam", f"{name} -> {value}")
        commits.append(git(repo, "rev-parse", "HEAD"))
        git(repo, "reset", "-q", "--hard", n.baseline)
    ledger = Ledger(n.results, fsync=False)
    for i, (commit, metric) in enumerate(zip(commits, (1.02, 1.01), strict=True), 1):
        ledger.append(LedgerRecord(trial=i, started_at=i, ended_at=i + 1, proposer="worker", parent=n.baseline,
                                   commit=commit, description=f"change {i}", status="keep", metric=metric,
                                   best=commit, best_metric=metric))
    proc = cli(repo, "finalize")
    assert proc.returncode == 0, proc.stderr
    final = git(repo, "show", "autoloop/t-final:train.py")
    assert "DEPTH = 6" in final and "DROPOUT = 0.2" in final
    assert f"note: its tree differs from the best commit {commits[1][:7]} in train.py" in proc.stdout


def test_finalize_ends_with_the_results_commit_and_notes_the_final_commits(night):
    """The last commit adds results.tsv (its rows equal the ledger's), report.md and
    progress.png, past .gitignore, on the final branch only; each kept-change commit carries
    the git note of the trial commit it replays."""
    from autoloop.observe.git_notes import NOTES_REF, notes_by_commit
    from autoloop.store.ledger import format_tsv

    repo = night.repo
    before = snapshot(repo)
    proc = cli(repo, "finalize")
    assert proc.returncode == 0, proc.stderr
    assert "autoloop results: 29 attempts of autoloop/t (results/results.tsv, results/report.md, " \
           "results/progress.png)" in proc.stdout
    assert snapshot(repo) == before                       # work tree, index, HEAD, branch untouched
    assert git(repo, "check-ignore", "results/results.tsv") == "results/results.tsv"   # ignored there...
    files = git(repo, "diff-tree", "--no-commit-id", "--name-only", "-r", "autoloop/t-final").splitlines()
    assert files == ["results/progress.png", "results/report.md", "results/results.tsv"]   # ...committed here
    assert git(repo, "ls-tree", "-r", "--name-only", "autoloop/t").count("results/") == 0

    tsv = subprocess.run(["git", "show", "autoloop/t-final:results/results.tsv"], cwd=repo, capture_output=True,
                         text=True, check=True).stdout
    assert tsv == format_tsv(night.records)
    lines = tsv.splitlines()
    header = lines[0].split("\t")
    rows = [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]
    judged = [r for r in night.records if r.status != "skip"]
    assert header[:5] == ["commit", "val_bpb", "memory_gb", "status", "description"]
    assert [(row["commit"], row["status"], row["trial"], row["description"]) for row in rows] == \
        [((r.commit or "-")[:7], r.status, str(r.trial) + (f".{r.attempt}" if r.attempt > 1 else ""), r.description)
         for r in judged]
    report = git(repo, "show", "autoloop/t-final:results/report.md")
    assert report.startswith("# autoloop report: autoloop/t") and "![val_bpb per attempt](progress.png)" in report
    png = subprocess.run(["git", "cat-file", "blob", "autoloop/t-final:results/progress.png"], cwd=repo,
                         capture_output=True, check=True).stdout
    assert png.startswith(b"\x89PNG\r\n")

    expected = notes_by_commit(night.records)
    finals = git(repo, "rev-list", "--reverse", f"{night.baseline}..autoloop/t-final~1").split()
    kept = [r for r in night.records if r.status == "keep" and r.kind != "baseline"]
    for sha, record in zip(finals, kept, strict=True):
        shown = subprocess.run(["git", "notes", "--ref", NOTES_REF, "show", sha], cwd=repo, capture_output=True,
                               text=True, check=True).stdout
        assert shown == expected[record.commit]
    story = git(repo, "log", "--notes=autoloop", "--format=%s%n%N", "autoloop/t-final")
    assert "#25 keep 1.0159 (-0.0009, 0.7σ) MATRIX_LR 0.06 -> 0.07" in story

    proc = cli(repo, "finalize", "--branch", "code-only", "--no-results")
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "rev-parse", "code-only^{tree}") == git(repo, "rev-parse", f"{night.best}^{{tree}}")


def test_finalize_replays_a_change_next_to_one_it_lacks_without_context_lines(tmp_path):
    """Three kept changes all built on the baseline, on neighbouring lines (DEPTH, the comment
    above it, WIDTH three lines below: inside git's three lines of context, so `git apply`
    refused the later ones): each applies on top of the others (core.revert.merge3, as
    --drop-unproven needs when it leaves out the change next to a kept one). A change of the
    same line as an earlier one still stops finalize, naming it."""
    from autoloop.store.ledger import Ledger, LedgerRecord

    n = build_night(tmp_path, [])
    repo = n.repo
    source = (repo / "train.py").read_text()
    edits = [set_values(source, DEPTH="6"), source.replace("# depth: what it does", "# depth: layers"),
             set_values(source, WIDTH="160"), set_values(source, DEPTH="8")]
    commits = []
    for i, text in enumerate(edits, 1):
        (repo / "train.py").write_text(text)
        git(repo, "commit", "-qam", f"change {i}")
        commits.append(git(repo, "rev-parse", "HEAD"))
        git(repo, "reset", "-q", "--hard", n.baseline)
    ledger = Ledger(n.results, fsync=False)

    def keep(i: int) -> None:
        ledger.append(LedgerRecord(trial=i, started_at=i, ended_at=i + 1, proposer="worker", parent=n.baseline,
                                   commit=commits[i - 1], description=f"change {i}", status="keep",
                                   metric=1.02 - i / 100, best=commits[i - 1], best_metric=1.02 - i / 100))

    for i in (1, 2, 3):
        keep(i)
    proc = cli(repo, "finalize", "--no-results")
    assert proc.returncode == 0, proc.stderr
    want = set_values(source, DEPTH="6", WIDTH="160").replace("# depth: what it does", "# depth: layers")
    assert git(repo, "show", "autoloop/t-final:train.py") == want.rstrip("\n")
    assert len(git(repo, "rev-list", f"{n.baseline}..autoloop/t-final").split()) == 3

    keep(4)
    proc = cli(repo, "finalize", "--no-results", "--branch", "other")
    assert proc.returncode == 1
    assert proc.stderr == ("autoloop: the kept change of trial 4 (change 4) does not apply on top of the earlier "
                           "kept changes: it rewrites lines of train.py they changed\n")
