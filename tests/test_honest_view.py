"""What a person reads in the first minutes of a night with noise samples: status, the report,
the progress chart and its running best, from a real night through the real CLI.

The stand-in (tests/trial_scripts/known_value.py) draws its noise from the seed; at WARMUP 16
the baseline's own run (seed 42) is below both noise samples (seeds 43, 44), so the best the
engine holds for the baseline, the mean of its runs, rises at each sample. What is shown must
not: the baseline is that mean with its σ, the running best never rises, and counts keep the
kept changes apart from the baseline, its noise samples and the re-runs.
"""

from __future__ import annotations

import difflib
import itertools
import shutil
import statistics
from pathlib import Path

import pytest
from helpers.git import init_repo
from helpers.loop import autoloop, read_ledger

from autoloop.review.report import write_report
from autoloop.review.status import status_data, status_text
from autoloop.store import queries
from autoloop.store.ledger import Ledger

KNOWN = Path(__file__).parent / "trial_scripts" / "known_value.py"
SOURCE = KNOWN.read_text().replace("WARMUP = 10 ", "WARMUP = 16 ", 1)


def _patch(description: str, old: str, new: str) -> str:
    diff = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), "a/train.py",
                                "b/train.py")
    return f"{description}\n\n" + "".join(diff)


@pytest.fixture(scope="module")
def night(tmp_path_factory, tiny_data_dir) -> Path:
    """Baseline, 2 noise samples, a clear gain (LR 0.02: -0.2) kept, a clear loss discarded."""
    assert "WARMUP = 16 " in SOURCE
    repo = init_repo(tmp_path_factory.mktemp("honest") / "repo", {"train.py": SOURCE})
    better = SOURCE.replace("LR = 0.01 ", "LR = 0.02 ", 1)
    queue = repo / "results" / "queue"
    queue.mkdir(parents=True)
    (queue / "01.patch").write_text(_patch("LR 0.01 -> 0.02", SOURCE, better))
    (queue / "02.patch").write_text(_patch("LR 0.02 -> 0.005", better, better.replace("LR = 0.02 ", "LR = 0.005", 1)))
    proc = autoloop(repo, "run", "--budget", "1", "--timeout", "30", "--proposer", "queue", "--tag", "t",
                    "--noise-runs", "2", data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return repo


def _first(repo: Path, n: int, tmp_path: Path) -> Path:
    """A results folder with the ledger's first n records: the night as it stood then."""
    results = tmp_path / "results"
    results.mkdir()
    lines = (repo / "results" / "ledger.jsonl").read_text().splitlines(keepends=True)
    (results / "ledger.jsonl").write_text("".join(lines[:n]))
    shutil.copy(repo / "results" / "state.json", results / "state.json")
    return results


def test_the_engine_s_best_rises_at_the_samples_and_the_running_best_does_not(night):
    ledger = read_ledger(night)
    assert [(r["kind"], r["status"], r["description"]) for r in ledger] == [
        ("baseline", "keep", "baseline"), ("confirm", "keep", "noise sample 1/2"),
        ("confirm", "keep", "noise sample 2/2"), ("candidate", "keep", "LR 0.01 -> 0.02"),
        ("candidate", "discard", "LR 0.02 -> 0.005")]
    runs = [r["metric"] for r in ledger[:3]]
    # The premise: the engine's best for the baseline (the mean so far) rises at a sample.
    assert ledger[1]["best_metric"] > ledger[0]["best_metric"]
    records = Ledger(night / "results").records()
    line = queries.running_best(records)
    assert line[:3] == [pytest.approx(statistics.mean(runs))] * 3
    assert all(b <= a for a, b in itertools.pairwise(line)), line
    assert line[3] == ledger[3]["best_metric"] == line[4]


def test_status_before_any_candidate_shows_the_baseline_as_its_mean(night, tmp_path):
    runs = [r["metric"] for r in read_ledger(night)[:3]]
    data = status_data(_first(night, 3, tmp_path))
    assert data["best"]["trial"] == 0 and data["best"]["description"] == "baseline"
    assert data["baseline"]["metric"] == pytest.approx(statistics.mean(runs)) == data["best"]["metric"]
    assert data["baseline"]["sigma"] == pytest.approx(statistics.stdev(runs)) and data["baseline"]["runs"] == 3
    assert data["improvement"] == 0.0
    assert data["status_counts"] == {"baseline": 1, "noise_sample": 2}
    text = status_text(data)
    assert "lower" not in text and "higher" not in text and "worse" not in text, text
    assert f"mean of 3 runs, σ {statistics.stdev(runs):.6f}" in text
    assert "1 trials, 3 attempts: baseline 1, noise samples 2" in text


def test_status_and_the_report_count_kept_changes_apart(night):
    runs = [r["metric"] for r in read_ledger(night)[:3]]
    data = status_data(night / "results")
    assert data["status_counts"] == {"baseline": 1, "noise_sample": 2, "keep": 1, "discard": 1}
    assert data["best"]["trial"] == 1 and data["baseline"]["metric"] == pytest.approx(statistics.mean(runs))
    assert data["improvement"] == pytest.approx(statistics.mean(runs) - data["best"]["metric"])
    assert "baseline 1, noise samples 2, keep 1, discard 1" in status_text(data)

    files = write_report(night / "results")
    md = files.markdown.read_text()
    assert f"| baseline | {statistics.mean(runs):.6f} (mean of 3 runs, σ {statistics.stdev(runs):.6f}) |" in md
    assert "| 1 kept change |" in md
    assert "1 baseline run, 2 noise samples, 1 kept change, 1 discarded." in md
    assert "counts as kept" not in md


def test_the_progress_chart_draws_the_samples_apart_and_a_running_best_that_never_rises(night):
    pytest.importorskip("matplotlib")
    from autoloop.review import plot

    records = Ledger(night / "results").records()
    drawn = plot._night(records)
    assert [p.record.description for p in drawn.kept] == ["baseline", "LR 0.01 -> 0.02"]
    assert drawn.baseline is not None and drawn.baseline.y == pytest.approx(statistics.mean(
        r.metric for r in records[:3]))
    assert [p.record.description for p in drawn.samples] == ["noise sample 1/2", "noise sample 2/2"]
    values = [y for _, y in drawn.line]
    assert all(b <= a for a, b in itertools.pairwise(values)), values
    assert plot.write_progress_png(records, night / "results" / "check.png").stat().st_size > 10_000
