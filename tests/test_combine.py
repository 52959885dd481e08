"""The combine proposer: the night's near-misses tried together, on a scripted train.py
stand-in whose two changes each cost a little alone and help only together (an interaction
one-change-at-a-time never reaches), through the real CLI in a real git repository."""

from __future__ import annotations

import sys

import pytest
from helpers.git import init_repo
from helpers.loop import assert_invariants, autoloop

from autoloop.proposers.combine import near_misses, tried
from autoloop.store.ledger import LedgerRecord

# A and B each cost 0.001 moved alone (a near-miss: under 0.2 % of the metric); moved together
# they gain 0.1. C is a third knob that only ever hurts, so the mutator has somewhere else to go.
TOGETHER = '''\
A = 1.0
# ---------------------------------------------------------------------------

B = 1.0
# ---------------------------------------------------------------------------

C = 1.0
# ---------------------------------------------------------------------------

alone = 0.001 * (A != 1.0) + 0.001 * (B != 1.0) + 0.05 * (C != 1.0)
print(f"val_bpb: {1.0 + alone - 0.1 * (A != 1.0 and B != 1.0):.6f}")
'''
TRIALS = "9"
FAST = ["--budget", "1", "--timeout", "30", "--command", f"{sys.executable} train.py", "--device", "cpu",
        "--noise-runs", "0", "--sanity-bound", "0", "--max-trials", TRIALS]


def night(tmp_path, name: str, data_dir, *flags: str):
    repo = init_repo(tmp_path / name, {"train.py": TOGETHER})
    proc = autoloop(repo, "run", *FAST, "--tag", "t", *flags, data_dir=data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return repo, proc, assert_invariants(repo)


def test_two_changes_that_only_help_together_are_found_by_combine_and_missed_by_the_mutator(tmp_path,
                                                                                             tiny_data_dir):
    repo, proc, ledger = night(tmp_path, "combined", tiny_data_dir, "--proposer", "portfolio",
                               "--portfolio", "mutate,combine")
    kept = [r for r in ledger if r["status"] == "keep" and r["kind"] != "baseline"]
    assert kept, proc.stdout
    combined = kept[0]
    parents = combined["extra"]["combine"]["parents"]
    assert len(parents) == 2 and combined["metric"] == pytest.approx(0.902)
    by_trial = {r["trial"]: r for r in ledger}
    # Each parent was a discarded move of A or of B, 0.001 worse than the baseline.
    moved = sorted(by_trial[p]["description"].split()[0] for p in parents)
    assert moved == ["A", "B"] and all(by_trial[p]["status"] == "discard" for p in parents)
    assert combined["description"].startswith("combine: ")
    autoloop(repo, "report", data_dir=tiny_data_dir, check=True)
    report = (repo / "results" / "report.md").read_text()
    assert f"(combines trials #{parents[0]} + #{parents[1]})" in report

    # The mutator alone, the same number of trials: one constant at a time never gets there.
    _, _, alone = night(tmp_path, "mutator", tiny_data_dir, "--proposer", "mutate")
    assert len([r for r in alone if r["kind"] == "candidate"]) >= int(TRIALS) - 1
    assert [r["trial"] for r in alone if r["status"] == "keep"] == [0]


def _rec(trial: int, **kw) -> LedgerRecord:
    fields = dict(trial=trial, attempt=1, started_at=1000.0 + trial, ended_at=1001.0 + trial, proposer="mutate",
                  description=f"move {trial}", status="discard", kind="candidate", commit=f"c{trial}" * 5,
                  parent="b" * 10)
    fields.update(kw)
    return LedgerRecord(**fields)


def test_a_near_miss_is_within_two_sigma_of_its_parent_or_a_share_of_it_without_a_noise_estimate():
    records = [_rec(0, kind="baseline", status="keep", commit="b" * 10, parent=None, metric=1.0, best="b" * 10,
                    best_metric=1.0),
               _rec(1, metric=1.0015), _rec(2, metric=1.01), _rec(3, metric=0.999), _rec(4, status="crash"),
               _rec(5, metric=1.0001, extra={"combine": {"parents": [1, 3]}})]
    found, sigma = near_misses(records, "min")
    assert sigma is None and [r.trial for _, r in found] == [3, 5, 1]   # 0.2 % of 1.0; the least lost first
    # A measured noise of 0.01: two sigma take in trial 2 too.
    records[0] = records[0].model_copy(update={"noise": 0.01, "extra": {"noise_method": "baseline repeats"}})
    found, sigma = near_misses(records, "min")
    assert sigma == 0.01 and [r.trial for _, r in found] == [3, 5, 1, 2]
    # Higher is better: the same numbers turn around.
    found, _ = near_misses(records, "max")
    assert [r.trial for _, r in found] == [2, 1, 5, 3]
    assert tried(records) == {frozenset({1, 3})}
