"""--proposer optuna end to end: the real CLI in real git repositories, a scripted train.py
stand-in (tests/trial_scripts/bowl.py: a known bowl over its constants, milliseconds a run),
and the SQLite study in results/optuna.db read back with Optuna itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from helpers.git import git, init_repo
from helpers.loop import assert_invariants, autoloop, read_ledger

from autoloop.proposers.mutate import find_constants
from autoloop.proposers.optuna_search import STUDY_FILE

BOWL = Path(__file__).resolve().parent / "trial_scripts" / "bowl.py"
FAST = ["--budget", "1", "--timeout", "30", "--command", f"{sys.executable} train.py", "--tag", "t", "--device", "cpu"]


@pytest.fixture
def bowl_repo(tmp_path) -> Path:
    return init_repo(tmp_path / "repo", {"train.py": BOWL.read_text()})


def run(repo: Path, data_dir: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return autoloop(repo, "run", "--proposer", "optuna", *FAST, *args, data_dir=data_dir, env=env)


def study_trials(repo: Path) -> list:
    storage = f"sqlite:///{repo / 'results' / STUDY_FILE}"
    summaries = optuna.get_all_study_summaries(storage)
    assert len(summaries) == 1, [s.study_name for s in summaries]
    return optuna.load_study(study_name=summaries[0].study_name, storage=storage).get_trials(deepcopy=False)


def values_at(repo: Path, commit: str) -> dict:
    return {c.name: c.value for c in find_constants(git(repo, "show", f"{commit}:train.py").encode())}


def candidates(ledger: list[dict]) -> list[dict]:
    return [r for r in ledger if r["kind"] == "candidate"]


def by_number(trials: list) -> dict:
    return {t.number: t for t in trials}


def test_resume_continues_the_same_study(bowl_repo, tiny_data_dir):
    first = run(bowl_repo, tiny_data_dir, "--max-trials", "4")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "proposer: optuna, sampler tpe (6 values of train.py; study in results/optuna.db)" in first.stdout
    best_before = [r["best_metric"] for r in read_ledger(bowl_repo) if r["best"]][-1]
    last_before = candidates(read_ledger(bowl_repo))[-1]
    # The last suggestion of a night is settled by the next proposal: still open now.
    assert by_number(study_trials(bowl_repo))[last_before["extra"]["optuna"]["trial"]].state.name == "RUNNING"

    second = run(bowl_repo, tiny_data_dir, "--max-trials", "3", "--resume")
    assert second.returncode == 0, second.stdout + second.stderr
    ledger = assert_invariants(bowl_repo)
    runs = candidates(ledger)
    assert len(runs) == 7 and all(r["proposer"] == "optuna" for r in runs)
    assert len([r for r in ledger if r["kind"] == "baseline"]) == 1        # the baseline was not run again

    # Nothing was run twice: every candidate wrote a point of its own.
    points = [tuple(sorted(values_at(bowl_repo, r["commit"]).items())) for r in runs]
    assert len(set(points)) == len(points)

    # One study: each candidate is its own Optuna trial, told its judged value (the last
    # one, of this run, stays open until a next proposal).
    trials = by_number(study_trials(bowl_repo))
    numbers = [r["extra"]["optuna"]["trial"] for r in runs]
    assert len(set(numbers)) == len(numbers) and numbers == sorted(numbers)
    for r in runs[:-1]:
        t = trials[r["extra"]["optuna"]["trial"]]
        assert t.user_attrs["autoloop"]["trial"] == r["trial"]
        assert t.state.name == "COMPLETE" and t.value == pytest.approx(r["metric"]), (r, t)
        assert t.user_attrs["autoloop"]["values"] == {k: v for k, v in values_at(bowl_repo, r["commit"]).items()
                                                      if k in t.user_attrs["autoloop"]["values"]}
    assert trials[last_before["extra"]["optuna"]["trial"]].state.name == "COMPLETE"   # settled on resume
    observed = [t for t in trials.values() if t.user_attrs["autoloop"].get("observed")]
    baseline = next(r for r in ledger if r["kind"] == "baseline")
    assert [(t.user_attrs["autoloop"]["trial"], t.value) for t in observed] == [(baseline["trial"], baseline["metric"])]

    # The best is kept across the restart.
    best_after = [r["best_metric"] for r in ledger if r["best"]][-1]
    assert best_after <= best_before
    assert best_after == min(r["metric"] for r in ledger if r["metric"] is not None and r["status"] == "keep")
    # Each description is the list of moves it made.
    for r in runs:
        moves = r["description"].split(", ")
        assert moves and all(" -> " in m for m in moves), r["description"]


def test_a_crashing_suggestion_is_told_failed_and_the_night_goes_on(bowl_repo, tiny_data_dir):
    # LR above 0.3 "diverges": about half of the log range [0.03, 3] around LR = 0.3.
    proc = run(bowl_repo, tiny_data_dir, "--max-trials", "6", env={"BOWL_CRASH_ABOVE": "0.3"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(bowl_repo)
    runs = candidates(ledger)
    assert len(runs) == 6
    crashed = [r for r in runs[:-1] if r["status"] == "crash"]
    assert crashed, [r["status"] for r in runs]
    trials = by_number(study_trials(bowl_repo))
    for r in crashed:
        assert r["crash"] == "fundamental" and "nan" in r["reason"]
        assert values_at(bowl_repo, r["commit"])["LR"] > 0.3
        assert trials[r["extra"]["optuna"]["trial"]].state.name == "FAIL"
    # The night went on after the first crash, and measured more points.
    after = [r for r in runs if r["trial"] > crashed[0]["trial"] and r["metric"] is not None]
    assert after


def test_an_interrupted_suggestion_is_run_again_after_resume(bowl_repo, tiny_data_dir):
    killed = run(bowl_repo, tiny_data_dir, "--max-trials", "5", env={"AUTOLOOP_FAULT_KILL_AT": "running:2"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    proc = run(bowl_repo, tiny_data_dir, "--max-trials", "2", "--resume", "--no-rerun-interrupted")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(bowl_repo)
    interrupted = next(r for r in ledger if r["trial"] == 2)
    assert interrupted["status"] == "crash" and interrupted["reason"].startswith("interrupted")
    again = next(r for r in ledger if r["trial"] == 3)
    assert again["metric"] is not None
    # The point the kill interrupted is the next one run: it was never measured.
    assert values_at(bowl_repo, again["commit"]) == values_at(bowl_repo, interrupted["commit"])
    trials = study_trials(bowl_repo)
    first = next(t for t in trials if t.user_attrs.get("autoloop", {}).get("trial") == 2)
    assert first.state.name == "FAIL"
    requeued = next(t for t in trials if t.user_attrs.get("requeued_from") == first.number)
    assert requeued.user_attrs["autoloop"]["trial"] == 3 and requeued.state.name == "COMPLETE"
    assert requeued.value == pytest.approx(again["metric"])


def test_a_point_already_measured_is_never_run_again(tmp_path, tiny_data_dir):
    # A space of two points: the baseline, and the flag flipped. Once both are measured,
    # every draw is a known point: the proposer has no more ideas, also after a restart.
    repo = init_repo(tmp_path / "repo", {"train.py": "FLAG = True\n\nprint('---')\n"
                                                     "print(f'val_bpb: {1.0 if FLAG else 0.9}')\n"})
    proc = run(repo, tiny_data_dir, "--max-trials", "5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stopped: proposer 'optuna' has no more ideas" in proc.stdout
    again = run(repo, tiny_data_dir, "--max-trials", "5", "--resume")
    assert again.returncode == 0 and "no more ideas" in again.stdout, again.stdout + again.stderr
    ledger = assert_invariants(repo)
    assert [r["description"] for r in candidates(ledger)] == ["FLAG True -> False"]
    trials = study_trials(repo)
    duplicates = [t for t in trials if t.user_attrs.get("duplicate")]
    assert duplicates and all(t.state.name == "COMPLETE" and t.value in (0.9, 1.0) for t in duplicates)


def test_points_of_other_proposers_are_learnt(tmp_path, tiny_data_dir):
    # Optuna runs out of ideas at trial 2 (its draws there are all known points); the queue
    # then proposes trial 2. The next optuna proposal learns that point, under its trial.
    source = "FLAG = True\n\nprint('---')\nprint(f'val_bpb: {1.0 if FLAG else 0.9}')\n"
    repo = init_repo(tmp_path / "repo", {"train.py": source})
    assert "no more ideas" in run(repo, tiny_data_dir, "--max-trials", "3").stdout
    queue = repo / "results" / "queue"
    queue.mkdir(parents=True)
    (queue / "01_flag_back.py").write_text("# autoloop: FLAG back on\n" + source)
    proc = autoloop(repo, "run", "--proposer", "queue", *FAST, "--resume", data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    queued = next(r for r in read_ledger(repo) if r["proposer"] == "queue")
    assert queued["trial"] == 2 and queued["metric"] == 1.0
    run(repo, tiny_data_dir, "--max-trials", "1", "--resume")
    observed = {t.user_attrs["autoloop"]["trial"]: t.user_attrs["autoloop"]["observed"] for t in study_trials(repo)
                if t.user_attrs["autoloop"].get("observed")}
    assert observed == {0: "-", 2: "queue"}


@pytest.mark.parametrize("sampler", ["cmaes", "gp"])
def test_other_samplers(bowl_repo, tiny_data_dir, sampler):
    proc = run(bowl_repo, tiny_data_dir, "--max-trials", "3", "--sampler", sampler)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = candidates(assert_invariants(bowl_repo))
    assert len(runs) == 3 and {r["extra"]["optuna"]["sampler"] for r in runs} == {sampler}
    assert all(" -> " in r["description"] for r in runs)


def test_parallel_workers_never_run_one_point_twice(bowl_repo, tiny_data_dir):
    proc = run(bowl_repo, tiny_data_dir, "--max-trials", "6", "--workers", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(bowl_repo)
    runs = [r for r in ledger if r["kind"] == "candidate"]
    assert len(runs) == 6 and {r["worker"] for r in runs} == {0, 1}
    points = [tuple(sorted(values_at(bowl_repo, r["commit"]).items())) for r in runs]
    assert len(set(points)) == len(points)
    trials = by_number(study_trials(bowl_repo))
    told = [trials[r["extra"]["optuna"]["trial"]] for r in runs]
    assert sum(t.state.name == "RUNNING" for t in told) <= 2      # at most the last one of each worker
    for r, t in zip(runs, told, strict=True):
        if t.state.name == "COMPLETE":
            assert t.value == pytest.approx(r["metric"])


def missing(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI with `module` impossible to import, as when the extra is not installed."""
    code = f"import sys; sys.modules[{module!r}] = None; from autoloop.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("module, args, message", [
    ("optuna", ["--proposer", "optuna"],
     "autoloop: --proposer optuna needs Optuna, which is not installed: pip install 'autoloop[hpo]'"),
    ("optuna", ["--portfolio", "optuna,mutate"],
     "autoloop: --proposer optuna needs Optuna, which is not installed: pip install 'autoloop[hpo]'"),
    ("cmaes", ["--proposer", "optuna", "--sampler", "cmaes"],
     "autoloop: --sampler cmaes needs the cmaes package, which is not installed: pip install 'autoloop[hpo]'"),
])
def test_a_missing_extra_is_one_line(bowl_repo, module, args, message):
    proc = missing(module, "run", *args, "--tag", "t", cwd=bowl_repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip() == message
    assert not (bowl_repo / "results" / "ledger.jsonl").exists()


def test_a_target_without_constants_is_one_line(tmp_path):
    repo = init_repo(tmp_path / "repo", {"train.py": "print('val_bpb: 1.0')\n"})
    proc = subprocess.run([sys.executable, "-m", "autoloop.cli", "run", "--proposer", "optuna", "--tag", "t"],
                          cwd=repo, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("autoloop: optuna: train.py has no UPPER_CASE constants to search")


def test_a_damaged_study_fails_the_proposal_not_the_night(bowl_repo, tiny_data_dir):
    proc = run(bowl_repo, tiny_data_dir, "--max-trials", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (bowl_repo / "results" / STUDY_FILE).write_bytes(b"this is not an SQLite database" * 100)
    # --max-trials 3: skips count toward it, so the failure limit (2) is what stops this run.
    again = run(bowl_repo, tiny_data_dir, "--max-trials", "3", "--resume", "--max-proposer-failures", "2")
    assert again.returncode == 0, again.stdout + again.stderr
    skips = [r for r in read_ledger(bowl_repo) if r["status"] == "skip"]
    assert len(skips) == 2 and all(r["reason"].startswith("optuna: results/optuna.db: ") for r in skips)
    assert "move the file aside" in skips[0]["reason"]
    assert "optuna failed 2 times in a row" in again.stdout
    # Moved aside, a new study relearns every point of the night from the ledger.
    (bowl_repo / "results" / STUDY_FILE).rename(bowl_repo / "results" / "damaged.db")
    fresh = run(bowl_repo, tiny_data_dir, "--max-trials", "1", "--resume")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    ledger = assert_invariants(bowl_repo)
    measured = sorted(r["trial"] for r in ledger if r["metric"] is not None and r["trial"] < ledger[-1]["trial"])
    observed = sorted(t.user_attrs["autoloop"]["trial"] for t in study_trials(bowl_repo)
                      if t.user_attrs["autoloop"].get("observed"))
    assert observed == measured == [0, 1]


def test_a_new_tag_archives_the_study_with_the_ledger(bowl_repo, tiny_data_dir):
    first = run(bowl_repo, tiny_data_dir, "--max-trials", "2")
    assert first.returncode == 0, first.stdout + first.stderr
    old = [r["extra"]["optuna"]["trial"] for r in candidates(read_ledger(bowl_repo))]
    # argparse keeps the last --tag: a new night on autoloop/t2, from the best of t.
    second = run(bowl_repo, tiny_data_dir, "--max-trials", "1", "--tag", "t2")
    assert second.returncode == 0, second.stdout + second.stderr
    archived = list((bowl_repo / "results" / "archive").glob("t-*"))
    assert len(archived) == 1 and (archived[0] / STUDY_FILE).exists() and (archived[0] / "ledger.jsonl").exists()
    storage = f"sqlite:///{archived[0] / STUDY_FILE}"
    (summary,) = optuna.get_all_study_summaries(storage)
    assert summary.n_trials >= len(old)
    # The new study has the new night's own trials (its baseline, observed, and one suggestion)
    # and, warm-started (engine/study.py), the first night's measured candidates, re-based.
    trials = study_trials(bowl_repo)
    own = [t for t in trials if "warm" not in t.user_attrs]
    assert [t.user_attrs["autoloop"]["trial"] for t in own if t.user_attrs["autoloop"].get("observed")] == [0]
    assert len([t for t in own if not t.user_attrs["autoloop"].get("observed")]) >= 1
    warm = sorted(t.user_attrs["autoloop"]["observed"] for t in trials if t.user_attrs.get("warm") == "t")
    first_night = [json.loads(line) for line in (archived[0] / "ledger.jsonl").read_text().splitlines()]
    assert warm and warm == sorted(f"t #{r['trial']}" for r in candidates(first_night)
                                   if r["status"] in ("keep", "discard"))
    assert "study: the search is warm-started from t (--no-warm-start to start cold)" in second.stdout
    assert all(r["proposer"] == "optuna" for r in candidates(read_ledger(bowl_repo)))


def test_a_scouted_out_suggestion_is_told_pruned_not_its_scout_value():
    """--scout: a suggestion stopped at the scout rung has only a scout run, whose number is on
    another scale than the full runs around it; Optuna is told it was pruned, and the point
    counts as not worth running again."""
    from autoloop.proposers.optuna_search import OptunaProposer
    from autoloop.proposers.outcomes import trial_outcomes
    from autoloop.store.ledger import LedgerRecord

    study = optuna.create_study(direction="minimize")
    dist = {"LR": optuna.distributions.FloatDistribution(0.001, 0.1, log=True)}
    asked = [study.ask(dist) for _ in range(2)]
    for n, t in enumerate(asked, start=1):
        t.set_user_attr("autoloop", {"trial": n, "values": {"LR": str(t.params["LR"])}})
    base = "b" * 40

    def rec(trial: int, metric: float, **kw) -> LedgerRecord:
        return LedgerRecord(trial=trial, started_at=trial, ended_at=trial + 1, proposer="optuna", status="discard",
                            description=f"LR {trial}", commit=str(trial) * 40, metric=metric, best=base,
                            best_metric=2.0, **kw)

    scout = {"kind": "scout", "fidelity": "scout"}
    records = [rec(0, 2.0, kind="baseline").model_copy(update={"status": "keep", "commit": base}),
               # trial 1: scouted out (its one run at the scout budget, far worse than a full run)
               rec(1, 3.4, **scout, extra={"optuna": {"trial": asked[0].number}}),
               # trial 2: promoted, then measured at the full budget
               rec(2, 3.0, **scout, next="promote", extra={"optuna": {"trial": asked[1].number}}),
               rec(2, 2.05, attempt=2, kind="candidate")]
    outcomes = trial_outcomes(records)
    assert outcomes[1].scouted_out and not outcomes[2].scouted_out and outcomes[2].value == 2.05
    trials = study.get_trials(deepcopy=False)
    assert OptunaProposer()._settle(optuna, study, trials, outcomes, in_flight=set())
    done = {t.number: t for t in study.get_trials()}
    assert done[asked[0].number].state == optuna.trial.TrialState.PRUNED and done[asked[0].number].value is None
    assert done[asked[1].number].state == optuna.trial.TrialState.COMPLETE and done[asked[1].number].value == 2.05
