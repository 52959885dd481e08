"""--prune end to end on tests/trial_scripts/curve.py: a real loop, real git, real processes.

The stand-in prints train.py's progress lines along a curve its constants set, so each test
chooses how a change trains: one behind the best's curve the whole way is stopped, recorded
as pruned (never kept, never a crash, nothing sent back for a fix), and the time it did not
train is counted; a change of schedule that is behind mid-run and wins at the end trains to
the end and is kept; a kill -9 of the orchestrator while a pruned run is being recorded is
taken up by --resume with nothing lost; with the machine's speed probed, a run on a machine
slowed for it is spared and a change that only makes steps slower is stopped.
"""

from __future__ import annotations

from pathlib import Path

from helpers.git import init_repo
from helpers.loop import TIMEOUT, assert_invariants, autoloop, autoloop_in_process, queue_file, read_tsv, set_constants

from autoloop.core.prune import WARMUP_SHARE, PruneRef, Watch
from autoloop.proposers.outcomes import trial_outcomes
from autoloop.review.dashboard.views import WorkspaceViews
from autoloop.store.ledger import LedgerRecord

CURVE = (Path(__file__).parent / "trial_scripts" / "curve.py").read_text()
ARGS = ["run", "--budget", "2", "--timeout", TIMEOUT, "--proposer", "queue", "--tag", "t", "--device", "cpu",
        "--prune"]
# Behind the best's curve the whole way: 0.5 nats at the start, 0.25 at the end.
LOSING = {"BEHIND": "0.5"}
# A longer warmup, as the real train.py's WARMUP_FRAC 0.02 -> 0.25 trained on this machine
# (benchmarks/data/prune_curves.json): behind by 0.5 (1 - p)^2, ahead by 0.05 at the end.
SCHEDULE = {"LAG": "0.5", "END": "1.95"}


def curve_repo(tmp_path: Path, *ideas: tuple[str, dict[str, str]]) -> Path:
    repo = init_repo(tmp_path / "repo", {"train.py": CURVE})
    for k, (description, values) in enumerate(ideas, 1):
        queue_file(repo, f"{k:02d}_idea.py", set_constants(CURVE, **values), description)
    return repo


def shape(ledger: list[dict]) -> list[tuple]:
    return [(r["trial"], r["attempt"], r["kind"], r["status"], r["crash"]) for r in ledger]


def test_a_pruned_trial_is_never_kept_nor_blamed_as_a_crash(tmp_path, tiny_data_dir):
    repo = curve_repo(tmp_path, ("behind all the way", LOSING), ("better", {"END": "1.9"}))
    proc = autoloop_in_process(repo, *ARGS, data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    assert shape(ledger) == [(0, 1, "baseline", "keep", None), (1, 1, "candidate", "pruned", None),
                             (2, 1, "candidate", "keep", None)]
    pruned = ledger[1]
    assert pruned["metric"] is None and pruned["best"] == ledger[0]["commit"] and pruned["next"] is None
    assert pruned["reason"].startswith("pruned: train loss")
    at = pruned["extra"]["prune"]["at_s"]
    assert 2.0 * WARMUP_SHARE <= at < 2.0   # past the warm-up share, before the end
    assert pruned["extra"]["curve"][-1][0] == at and len(pruned["extra"]["curve"]) >= 2   # its partial curve kept
    assert ledger[0]["extra"]["curve"][-1][0] == 2.0    # the best's whole curve, stored with its record
    tsv = read_tsv(repo)
    assert tsv[1]["status"] == "discard" and tsv[1]["description"].startswith("[pruned at ")
    assert tsv[1]["crash"] == "-"
    # the proposer's memory: pruned, not a crash, not measured
    outcomes = trial_outcomes([LedgerRecord.model_validate(r) for r in ledger])
    assert outcomes[1].status == "pruned" and not outcomes[1].kept
    status = autoloop_in_process(repo, "status", data_dir=tiny_data_dir).stdout
    assert "pruning: 1 of 2 trials pruned" in status and "rule on" in status
    dashboard = WorkspaceViews(repo).summary()   # what the dashboard's page is sent
    assert dashboard["status_counts"]["pruned"] == 1 and dashboard["pruning"][0].startswith("pruning: 1 of 2")
    autoloop_in_process(repo, "report", data_dir=tiny_data_dir)
    report = (repo / "results" / "report.md").read_text()
    assert "## Pruning" in report and "#1 pruned" in report and "pruned behind the best's curve" in report


def test_a_schedule_change_behind_mid_run_that_wins_at_the_end_is_not_pruned(tmp_path, tiny_data_dir):
    repo = curve_repo(tmp_path, ("WARMUP_FRAC 0.02 -> 0.25", SCHEDULE))
    proc = autoloop_in_process(repo, *ARGS, data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    assert shape(ledger) == [(0, 1, "baseline", "keep", None), (1, 1, "candidate", "keep", None)]
    # it was behind the best's curve beyond the band past the warm-up share: the rule without
    # its look at the slope stops it on these very curves, the default rule did not
    best = PruneRef(tuple((p[0], p[1]) for p in ledger[0]["extra"]["curve"]), None, 2.0)
    mine = [(p[0], p[1]) for p in ledger[1]["extra"]["curve"]]   # [s, loss, step]: on time alone
    plain = Watch(best, project=False)
    assert any(plain.see(t, v) for t, v in mine) and plain.verdict is not None and plain.verdict.gap > 0.04
    assert not any(Watch(best).see(t, v) for t, v in mine)


def test_the_machines_pace_spares_a_slowed_machine_and_stops_slower_steps(tmp_path, tiny_data_dir):
    repo = curve_repo(tmp_path, ("nothing but a slower machine", {"BEHIND": "0.001"}),
                      ("every step twice as long", {"STEP_COST": "2.0"}))
    # the probe's knob, one factor per probed run: the baseline at 1, the first idea's machine
    # at half the speed (the stand-in walks its curve at half the steps), the second's at 1
    proc = autoloop(repo, *ARGS, "--machine-probe", data_dir=tiny_data_dir,
                    env={"AUTOLOOP_PROBE_SCALE": "1,0.5,1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    # both level with the best at the same step and behind it at the same time; the first was
    # the machine's doing (trained to the end, worse for its lost steps: discarded by its
    # metric), the second the change's (stopped: the step check alone would have spared it)
    assert shape(ledger) == [(0, 1, "baseline", "keep", None), (1, 1, "candidate", "discard", None),
                             (2, 1, "candidate", "pruned", None)]
    assert [r["machine_speed"] for r in ledger] == [1e6, 5e5, 1e6]
    assert ledger[1]["extra"]["curve"][-1][0] == 2.0
    assert ledger[2]["reason"].startswith("pruned: train loss") and "pace" not in ledger[2]["reason"]


def test_resume_after_kill_while_a_pruned_run_is_recorded(tmp_path, tiny_data_dir):
    repo = curve_repo(tmp_path, ("behind all the way", LOSING), ("better", {"END": "1.9"}))
    # killed after the pruned run's tree was ended, before its record was appended
    proc = autoloop(repo, *ARGS, data_dir=tiny_data_dir, env={"AUTOLOOP_FAULT_KILL_AT": "judging:1"})
    assert proc.returncode == -9, proc.stdout + proc.stderr
    resumed = autoloop(repo, *ARGS, "--resume", data_dir=tiny_data_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    ledger = assert_invariants(repo)
    # the interrupted attempt recorded by recovery, run again, pruned again; then the next idea
    assert shape(ledger) == [(0, 1, "baseline", "keep", None), (1, 1, "candidate", "crash", "fundamental"),
                             (1, 2, "candidate", "pruned", None), (2, 1, "candidate", "keep", None)]
    assert ledger[1]["reason"].startswith("interrupted")
    assert ledger[3]["best_metric"] < 1.91
