"""Noise end to end: a real train.py, a fresh repo, --noise-runs 2, --budget 2.

The baseline runs three times (seeds 42, 43, 44): the ledger carries the samples and
their spread, the best is their mean, every judged row carries its confidence in
sigma, and results.tsv has the confidence column. A huge --noise-z makes even a
large gain "within noise", and no count of runs could keep it at that bar: the candidate
is confirmed with the most runs a confirmation makes (1 + MAX_CONFIRMATIONS, kind confirm,
same commit), discarded on the mean of all, and the branch ends at the baseline.
"""

from __future__ import annotations

import statistics

import pytest
from helpers.git import init_repo
from helpers.loop import BUDGET, GOOD, SLOW, TIMEOUT, assert_invariants, autoloop, queue_file, read_ledger, read_tsv

from autoloop.core.power import MAX_CONFIRMATIONS
from autoloop.store.ledger import TSV_COLUMNS


def test_noise_runs_confidence_and_confirmation(tmp_path, tiny_data_dir):
    repo = init_repo(tmp_path / "repo", {"train.py": SLOW})
    queue_file(repo, "01_good.py", GOOD, "restore learning rates")
    proc = autoloop(repo, "run", "--budget", BUDGET, "--timeout", TIMEOUT, "--proposer", "queue", "--tag", "t",
                    "--device", "cpu", "--noise-runs", "2", "--noise-z", "1e6", data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    assert [(r["trial"], r["attempt"], r["kind"], r["status"]) for r in ledger] == [
        (0, 1, "baseline", "keep"), (0, 2, "confirm", "keep"), (0, 3, "confirm", "keep"),
        (1, 1, "candidate", "discard"), *((1, a, "confirm", "discard") for a in range(2, 2 + MAX_CONFIRMATIONS))]
    base, s1, s2, cand, *confirms = ledger
    conf = confirms[-1]
    # noise samples: other seeds, the running list of samples, their stdev, the best = their mean
    assert [base["seed"], s1["seed"], s2["seed"]] == [42, 43, 44]
    assert s1["reason"] == "noise sample 1/2" and s2["reason"] == "noise sample 2/2"
    samples = [base["metric"], s1["metric"], s2["metric"]]
    assert s2["extra"]["noise_samples"] == pytest.approx(samples)
    assert s2["extra"]["noise_method"] == "stdev"
    assert s2["noise"] == pytest.approx(statistics.stdev(samples))
    assert s2["best_metric"] == pytest.approx(statistics.mean(samples))
    assert s2["noise"] > 0
    # the candidate: confidence = gain over the mean / sigma, confirmed (no count reaches the
    # power at that bar: capped, said so), then within noise on the mean of all its runs
    sigma = s2["noise"]
    assert cand["noise"] == pytest.approx(sigma)
    assert cand["confidence"] == pytest.approx((s2["best_metric"] - cand["metric"]) / sigma)
    assert cand["confidence"] > 3    # a real gain of several bits, far beyond the noise
    assert f"confirming with {MAX_CONFIRMATIONS} more runs" in cand["reason"]
    assert cand["reason"].endswith(f"no count reaches 80%, capped at {MAX_CONFIRMATIONS} more)")
    assert {r["commit"] for r in confirms} == {cand["commit"]}
    assert [r["seed"] for r in [cand, *confirms]] == list(range(42, 43 + MAX_CONFIRMATIONS))
    assert [r["next"] for r in [cand, *confirms]] == ["confirm"] * MAX_CONFIRMATIONS + [None]
    assert conf["reason"].startswith(f"within noise (mean of {1 + MAX_CONFIRMATIONS} runs")
    assert conf["extra"]["runs"] == pytest.approx([r["metric"] for r in [cand, *confirms]])
    assert all(r["best"] == base["commit"] for r in confirms)
    # results.tsv: the confidence column (then the worker's), '-' where there is nothing to compare
    rows = read_tsv(repo)
    assert list(rows[0]) == TSV_COLUMNS and TSV_COLUMNS[-3:] == ["confidence", "worker", "hypothesis"]
    assert {r["worker"] for r in rows} == {"-"}
    assert [r["trial"] for r in rows] == ["0", "0.2", "0.3", "1", *(f"1.{a}" for a in range(2, 2 + MAX_CONFIRMATIONS))]
    assert [r["confidence"] for r in rows[:3]] == ["-", "-", "-"]
    assert rows[3]["confidence"] == f"{cand['confidence']:.1f}"
    status = autoloop(repo, "status", data_dir=tiny_data_dir, check=True).stdout
    assert "noise: σ" in status
    # the held-out audit figure is recorded on every judged run, and reported, never in the TSV
    assert all(isinstance(r["extra"].get("audit_bpb"), float) for r in ledger)
    assert "audit" not in (repo / "results" / "results.tsv").read_text()
    autoloop(repo, "report", data_dir=tiny_data_dir, check=True)
    assert "Held-out audit slice" in (repo / "results" / "report.md").read_text()


def test_strict_rule_keeps_without_confirmation(baselined_repo, tiny_data_dir):
    """On a branch with no noise estimate (the template ran --noise-runs 0) auto is strict;
    --remeasure then estimates the noise of the best before the next trial."""
    repo = baselined_repo
    queue_file(repo, "01_good.py", GOOD, "restore learning rates")
    proc = autoloop(repo, "run", "--budget", BUDGET, "--timeout", TIMEOUT, "--proposer", "queue", "--tag", "t",
                    "--device", "cpu", "--resume", "--remeasure", "--noise-runs", "1", data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    assert [(r["trial"], r["attempt"], r["kind"], r["status"]) for r in ledger] == [
        (0, 1, "baseline", "keep"), (0, 2, "confirm", "keep"), (1, 1, "candidate", "keep")]
    sample, cand = ledger[1], ledger[2]
    assert sample["noise"] is not None and sample["extra"]["noise_method"] == "stdev"
    assert cand["noise"] == sample["noise"] and cand["confidence"] is not None and cand["confidence"] > 0


def killed_within_noise(tmp_path, tiny_data_dir, point: str) -> tuple:
    """A night whose one candidate is a gain "within noise" (a huge --noise-z), SIGKILLed at
    ``point``: the repo and the arguments that resume it."""
    repo = init_repo(tmp_path / "repo", {"train.py": SLOW})
    queue_file(repo, "01_good.py", GOOD, "restore learning rates")
    args = ["run", "--budget", BUDGET, "--timeout", TIMEOUT, "--proposer", "queue", "--tag", "t", "--device", "cpu",
            "--noise-runs", "1", "--noise-z", "1e6"]
    killed = autoloop(repo, *args, data_dir=tiny_data_dir, env={"AUTOLOOP_FAULT_KILL_AT": point})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    return repo, args


def test_kill_during_a_confirmation_is_recovered(tmp_path, tiny_data_dir):
    repo, args = killed_within_noise(tmp_path, tiny_data_dir, "running:1.2")
    # killed with the candidate checked out for its re-run
    resumed = autoloop(repo, *args, "--resume", "--no-rerun-interrupted", data_dir=tiny_data_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    ledger = assert_invariants(repo)
    assert [(r["trial"], r["attempt"], r["kind"], r["status"]) for r in ledger] == [
        (0, 1, "baseline", "keep"), (0, 2, "confirm", "keep"), (1, 1, "candidate", "discard"),
        (1, 2, "confirm", "crash")]
    assert ledger[-1]["reason"].startswith("interrupted") and ledger[-1]["commit"] == ledger[2]["commit"]
    assert ledger[-1]["best"] == ledger[0]["commit"]


def test_a_confirmation_cut_off_after_its_decision_runs_at_resume(tmp_path, tiny_data_dir):
    """kill -9 just after the record that says next: confirm (the window a Ctrl-C also
    leaves: the night stops before the re-run): --resume runs the confirmation, once.
    (tests/test_confirm_power.py kills between two runs of a confirmation.)"""
    repo, args = killed_within_noise(tmp_path, tiny_data_dir, "recorded:1")
    first = read_ledger(repo)[-1]
    assert (first["trial"], first["attempt"], first["next"]) == (1, 1, "confirm")

    resumed = autoloop(repo, *args, "--resume", data_dir=tiny_data_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "#1: resuming its confirmation" in resumed.stdout
    ledger = assert_invariants(repo)
    assert [(r["trial"], r["attempt"], r["kind"], r["status"]) for r in ledger] == [
        (0, 1, "baseline", "keep"), (0, 2, "confirm", "keep"), (1, 1, "candidate", "discard"),
        *((1, a, "confirm", "discard") for a in range(2, 2 + MAX_CONFIRMATIONS))]
    confirms = ledger[3:]
    conf = confirms[-1]
    # the same commit with the next seeds, judged on the mean of all runs, as without the kill
    assert {r["commit"] for r in confirms} == {first["commit"]}
    assert [r["seed"] for r in confirms] == [first["seed"] + k for k in range(1, 1 + MAX_CONFIRMATIONS)]
    assert conf["reason"].startswith(f"within noise (mean of {1 + MAX_CONFIRMATIONS} runs")
    assert conf["extra"]["runs"] == pytest.approx([first["metric"], *(r["metric"] for r in confirms)])
    assert all(r["best"] == ledger[0]["commit"] for r in confirms)
    # Taken up once: a further start finds nothing decided and not run.
    again = autoloop(repo, *args, "--resume", data_dir=tiny_data_dir)
    assert again.returncode == 0 and "resuming its confirmation" not in again.stdout, again.stdout + again.stderr
    assert len(read_ledger(repo)) == len(ledger)
