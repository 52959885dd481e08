"""--scout end to end on tests/trial_scripts/rungs.py: a real loop, real git, real processes.

The stand-in reports one value at the scout budget (1 s) and another at the full one (2 s),
so each test sets how the rungs agree: a proposal that loses badly at the scout rung never
gets the full budget (even one that would have won there), every keep is trained at the
full budget, scouting switches itself off where the rungs disagree, and a kill -9 during a
scout run and during a promoted run is taken up by --resume.
"""

from __future__ import annotations

from pathlib import Path

from helpers.git import init_repo
from helpers.loop import (
    TIMEOUT,
    assert_invariants,
    autoloop,
    autoloop_in_process,
    queue_file,
    read_ledger,
    read_tsv,
    set_constants,
)

from autoloop.core.scout import MIN_PAIRS

RUNGS = (Path(__file__).parent / "trial_scripts" / "rungs.py").read_text()
ARGS = ["run", "--budget", "2", "--scout", "1", "--timeout", TIMEOUT, "--proposer", "queue", "--tag", "t",
        "--device", "cpu"]


def rungs(scout: float, full: float) -> str:
    return set_constants(RUNGS, SCOUT_BPB=str(scout), FULL_BPB=str(full))


def scouting_repo(tmp_path: Path, *ideas: tuple[float, float]) -> Path:
    repo = init_repo(tmp_path / "repo", {"train.py": RUNGS})
    for k, (scout, full) in enumerate(ideas, 1):
        queue_file(repo, f"{k:02d}_idea.py", rungs(scout, full), f"idea {k}: scout {scout}, full {full}")
    return repo


def shape(ledger: list[dict]) -> list[tuple]:
    return [(r["trial"], r["attempt"], r["kind"], r["fidelity"], r["status"]) for r in ledger]


def test_scouted_out_never_gets_the_full_budget_and_keeps_are_full(tmp_path, tiny_data_dir):
    # idea 1 loses badly at the scout rung (though it would win at the full one); idea 2 wins at both.
    repo = scouting_repo(tmp_path, (6.0, 4.0), (4.5, 4.5))
    proc = autoloop_in_process(repo, *ARGS, data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    assert shape(ledger) == [
        (0, 1, "baseline", "full", "keep"), (0, 2, "scout", "scout", "discard"), (0, 3, "scout", "scout", "discard"),
        (1, 1, "scout", "scout", "discard"),
        (2, 1, "scout", "scout", "discard"), (2, 2, "candidate", "full", "keep"),
        # fresh scout samples of the new best: the reference of the next scout results
        (2, 3, "scout", "scout", "discard"), (2, 4, "scout", "scout", "discard")]
    assert ledger[3]["extra"]["scout"]["promoted"] is False and ledger[3]["next"] is None
    assert ledger[3]["reason"].startswith("scouted out: 6.00")
    assert ledger[4]["next"] == "promote" and ledger[5]["commit"] == ledger[4]["commit"]
    assert all(r["fidelity"] == "full" for r in ledger if r["status"] == "keep")
    assert ledger[5]["best_metric"] < 4.51 and ledger[-1]["extra"]["scout_sample"]
    tsv = read_tsv(repo)
    assert tsv[3]["description"].startswith("[scouted out] idea 1") and tsv[3]["status"] == "discard"
    assert tsv[5]["description"] == "idea 2: scout 4.5, full 4.5"
    status = autoloop_in_process(repo, "status", data_dir=tiny_data_dir).stdout
    assert "scout rung: 2 scouted, 1 promoted, 1 scouted out" in status
    assert "full rung: 2 runs" in status
    autoloop_in_process(repo, "report", data_dir=tiny_data_dir)
    report = (repo / "results" / "report.md").read_text()
    assert "## Scout and full rungs" in report and "1 scouted out" in report


def test_scouting_switches_itself_off_where_the_rungs_disagree(tmp_path, tiny_data_dir):
    # every idea looks better than the best at the scout rung, in the reverse order of the full one
    ideas = [(4.0 + 0.01 * k, 5.5 - 0.01 * k) for k in range(MIN_PAIRS + 1)]
    repo = scouting_repo(tmp_path, *ideas)
    proc = autoloop_in_process(repo, *ARGS, data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("scouting off: the scout rung stopped predicting") == 1, proc.stdout
    ledger = assert_invariants(repo)
    last = [r for r in ledger if r["trial"] == MIN_PAIRS + 1]
    assert [(r["kind"], r["fidelity"]) for r in last] == [("candidate", "full")]
    promoted = [r for r in ledger if r["kind"] == "scout" and r["extra"].get("scout", {}).get("promoted")]
    assert len(promoted) == MIN_PAIRS


def killed(tmp_path: Path, tiny_data_dir: Path, point: str) -> Path:
    repo = scouting_repo(tmp_path, (4.5, 4.5))
    proc = autoloop(repo, *ARGS, data_dir=tiny_data_dir, env={"AUTOLOOP_FAULT_KILL_AT": point})
    assert proc.returncode == -9, proc.stdout + proc.stderr
    resumed = autoloop(repo, *ARGS, "--resume", data_dir=tiny_data_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    return repo


def test_resume_after_kill_during_a_scout_run(tmp_path, tiny_data_dir):
    repo = killed(tmp_path, tiny_data_dir, "running:1")
    ledger = assert_invariants(repo)
    trial = [(r["attempt"], r["kind"], r["fidelity"], r["status"]) for r in ledger if r["trial"] == 1]
    # the interrupted scout run, run again at the scout budget, promoted, kept at the full budget
    assert trial[:3] == [(1, "scout", "scout", "crash"), (2, "scout", "scout", "discard"),
                         (3, "candidate", "full", "keep")]
    assert ledger[-1]["best_metric"] < 4.51


def test_resume_after_kill_during_a_promoted_run(tmp_path, tiny_data_dir):
    repo = killed(tmp_path, tiny_data_dir, "running:1.2")
    ledger = read_ledger(repo)
    assert_invariants(repo)
    trial = [(r["attempt"], r["kind"], r["fidelity"], r["status"]) for r in ledger if r["trial"] == 1]
    # promoted, killed at the full budget, run again at the full budget (not scouted again)
    assert trial[:3] == [(1, "scout", "scout", "discard"), (2, "candidate", "full", "crash"),
                         (3, "candidate", "full", "keep")]
