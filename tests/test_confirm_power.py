"""The keep rule's confirmation, its count chosen from power, end to end through the real CLI.

The stand-in (tests/trial_scripts/known_value.py) reports a known value plus noise drawn from
the seed and its constants, at once (the budget is not slept). The baseline (LR 0.01, value
3.0) runs with seeds 42-44 (--noise-runs 2): the best is their mean, σ their spread. Each
queued change sets LR 0.0102 (a true gain of 0.0057, 1.9 times the stand-in's σ 0.003) and a WARMUP, which changes
nothing but the noise stream, chosen so that its first run (seed 42) is a gain within 2 σ:

* WARMUP 37: 3 runs give 80 % power for the gain its first run showed; the mean of the 3
  is not enough: discarded on the mean of all;
* WARMUP 115: 4 runs asked (capped); its second run brings the mean behind the best: stopped
  at 2 of 4 (the one early stop allowed);
* WARMUP 11: 80 % power needs 6 runs, capped at 4; the mean of the 4 is kept: an
  under-powered keep, named at the end of the run and in the report.

Every number asserted is derived from the ledger and the stand-in's own functions, never
copied from a run.
"""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

import pytest
from helpers.git import init_repo
from helpers.loop import assert_invariants, autoloop, autoloop_in_process, queue_patch, read_ledger, set_constants

from autoloop.core.power import confirm_runs

KNOWN = Path(__file__).parent / "trial_scripts" / "known_value.py"
SOURCE = KNOWN.read_text()
ARGS = ("run", "--budget", "1", "--timeout", "30", "--proposer", "queue", "--tag", "t", "--noise-runs", "2")
WARMUPS = {"discarded": 37, "futile": 115, "kept": 11}


def _stand_in():
    spec = importlib.util.spec_from_file_location("known_value", KNOWN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KV = _stand_in()


def value(seed: int, lr: float = 0.01, warmup: int = 10) -> float:
    """What the stand-in reports for these constants at this seed."""
    return KV.true_value(lr, 2) + KV.noise(seed, lr, 2, warmup)


def _queue(repo: Path, *cases: str) -> None:
    for i, case in enumerate(cases, 1):
        queue_patch(repo, f"{i:02d}.patch", SOURCE, set_constants(SOURCE, LR="0.0102", WARMUP=str(WARMUPS[case])),
                    f"LR 0.0102, WARMUP {WARMUPS[case]}")


def _chain(ledger: list[dict], trial: int) -> list[dict]:
    return [r for r in ledger if r["trial"] == trial]


def _check_chain(chain: list[dict], best: float, sigma: float, warmup: int) -> tuple[str, int]:
    """The trial's runs are the stand-in's at seeds 42, 43, ..., its count the one core chooses
    for its first run's gain, and its verdict the keep rule's on the mean of its runs."""
    first, last = chain[0], chain[-1]
    assert [r["seed"] for r in chain] == list(range(42, 42 + len(chain)))
    assert [r["metric"] for r in chain] == pytest.approx([value(r["seed"], 0.0102, warmup) for r in chain])
    assert [r["kind"] for r in chain] == ["candidate"] + ["confirm"] * (len(chain) - 1)
    assert len({r["commit"] for r in chain}) == 1
    gain = best - first["metric"]
    assert 0 < gain <= 2 * sigma   # the premise: within noise
    count = confirm_runs(gain, sigma, 3, 0.8, 2.0)
    assert first["extra"]["confirmation"] == pytest.approx(count.as_dict())
    assert first["reason"].startswith("within noise") and first["reason"].endswith(count.text())
    # Every record of the chain but its last asked for the next run; each carries the count.
    assert [r["next"] for r in chain] == ["confirm"] * (len(chain) - 1) + [None]
    assert all(r["extra"]["confirmation"] == pytest.approx(count.as_dict()) for r in chain)
    mean = statistics.fmean(r["metric"] for r in chain)
    if len(chain) < count.runs:   # stopped early: only where the mean is no better than the best
        assert mean >= best and last["status"] == "discard"
        assert last["reason"].endswith(f"stopped at {len(chain)} of {count.runs} runs)")
        return "stopped", count.runs
    kept = best - mean > 2 * sigma / len(chain) ** 0.5
    assert last["status"] == ("keep" if kept else "discard")
    assert last["reason"].startswith(f"mean of {len(chain)} runs: improved" if kept
                                     else f"within noise (mean of {len(chain)} runs")
    assert last["extra"]["runs"] == pytest.approx([r["metric"] for r in chain])
    if kept:
        assert last["best_metric"] == pytest.approx(mean)
    return last["status"], count.runs


def _baseline(ledger: list[dict]) -> tuple[float, float]:
    base = [r["metric"] for r in ledger if r["trial"] == 0]
    assert base == pytest.approx([value(s) for s in (42, 43, 44)])
    return statistics.fmean(base), statistics.stdev(base)


def test_a_within_noise_gain_gets_the_runs_power_asks_for_and_is_judged_on_their_mean(tmp_path, tiny_data_dir):
    repo = init_repo(tmp_path / "repo", {"train.py": SOURCE})
    _queue(repo, "discarded", "futile", "kept")
    proc = autoloop_in_process(repo, *ARGS, data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    best, sigma = _baseline(ledger)
    assert ledger[3]["noise"] == pytest.approx(sigma)
    verdicts = [_check_chain(_chain(ledger, t), best, sigma, WARMUPS[case])
                for t, case in enumerate(("discarded", "futile", "kept"), 1)]
    # 3 runs were enough for 80 % and were all run; 4 (capped) asked of the other two.
    assert verdicts == [("discard", 3), ("stopped", 4), ("keep", 4)]
    assert [len(_chain(ledger, t)) for t in (1, 2, 3)] == [3, 2, 4]
    kept = _chain(ledger, 3)[-1]
    assert kept["extra"]["confirmation"]["needs"] == 6 and kept["extra"]["confirmation"]["runs"] == 4
    # The under-powered keep is named at the end of the run and in the report; the others are not.
    summary = next(line.split(" ", 1)[1] for line in proc.stdout.splitlines() if "under-powered keeps" in line)
    assert summary.startswith("under-powered keeps (confirmed on fewer runs than --power 0.8 asked): #3 (kept on "
                              "4 runs: power ") and summary.endswith("; 80% needs 6)") and "#1" not in summary
    autoloop_in_process(repo, "report", data_dir=tiny_data_dir)
    report = (repo / "results" / "report.md").read_text()
    assert "**Under-powered**: kept on fewer runs than `--power` asked for" in report
    assert "#3 (kept on 4 runs: power " in report


def test_kill_between_two_confirmations_resumes_the_remaining_ones(tmp_path, tiny_data_dir):
    """kill -9 just after the first confirmation's record (next: confirm, 2 of 4 runs done):
    --resume runs the two left, with the seeds and the judgement the night would have had."""
    repo = init_repo(tmp_path / "repo", {"train.py": SOURCE})
    _queue(repo, "kept")
    killed = autoloop(repo, *ARGS, data_dir=tiny_data_dir, env={"AUTOLOOP_FAULT_KILL_AT": "recorded:1.2"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    cut = read_ledger(repo)
    assert [(r["trial"], r["attempt"], r["next"]) for r in cut[3:]] == [(1, 1, "confirm"), (1, 2, "confirm")]

    resumed = autoloop(repo, *ARGS, "--resume", data_dir=tiny_data_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.count("#1: resuming its confirmation") == 1
    ledger = assert_invariants(repo)
    assert ledger[:5] == cut   # nothing recorded before the kill is changed
    best, sigma = _baseline(ledger)
    assert _check_chain(_chain(ledger, 1), best, sigma, WARMUPS["kept"]) == ("keep", 4)
    assert [r["attempt"] for r in _chain(ledger, 1)] == [1, 2, 3, 4]
    assert "under-powered keeps (confirmed on fewer runs than --power 0.8 asked): #1 (kept on 4 runs" in resumed.stdout
