"""Metric guards (--guard), checks before training (--check) and the secondary metrics of
every attempt: the grammar and the keep rule as tables, then the real CLI on scripted
stand-ins (tests/trial_scripts/learner.py, and a foreign --command printing NAME: value lines).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers.git import git, init_repo
from helpers.loop import (
    GOOD,
    LR_ARGS,
    LRS,
    SLOW,
    assert_invariants,
    autoloop,
    queue_file,
    read_ledger,
    run_args,
    set_constants,
)

from autoloop.core.guards import Guard, breaches, missing_in_baseline, parse_guard
from autoloop.core.keep import Facts, Rules, decide
from autoloop.execution.runner import _parse_summary

FAKE_AGENTS = Path(__file__).resolve().parent / "fake_agents"

# ------------------------------------------------------------------------------ the grammar


@pytest.mark.parametrize("text,guard", [
    ("peak_vram_mb <= 1.10 * baseline", Guard("peak_vram_mb", "<=", 1.10, True)),
    ("tokens_per_second >= 0.9 * baseline", Guard("tokens_per_second", ">=", 0.9, True)),
    ("num_params_M <= 120", Guard("num_params_M", "<=", 120.0, False)),
    ("mfu_percent>30", Guard("mfu_percent", ">", 30.0, False)),
    ("x < baseline", Guard("x", "<", 1.0, True)),
    ("  loss_spikes <= 0  ", Guard("loss_spikes", "<=", 0.0, False)),
    ("y >= -1e3", Guard("y", ">=", -1000.0, False)),
])
def test_guards_parse(text, guard):
    assert parse_guard(text) == guard


@pytest.mark.parametrize("text", [
    "peak_vram_mb =< 3", "peak_vram_mb <= ", "<= 3", "peak vram <= 3", "a <= 1.1 * basline", "a <= 3 + 1",
    "a <= 0 * baseline", "a == 3", "", "a <= 1.1 * baseline * 2",
])
def test_malformed_guards_are_refused(text):
    with pytest.raises(ValueError):
        parse_guard(text)


def test_breaches_name_the_guard_and_both_numbers():
    g = parse_guard("peak_vram_mb <= 1.10 * baseline")
    (b,) = breaches([g], {"peak_vram_mb": 1200.0}, {"peak_vram_mb": 1000.0})
    assert b.reason == "guard peak_vram_mb <= 1.1 * baseline breached: peak_vram_mb 1200 vs limit 1100 " \
                       "(1.1 x baseline 1000)"
    assert breaches([g], {"peak_vram_mb": 1100.0}, {"peak_vram_mb": 1000.0}) == []
    (b,) = breaches([g], {}, {"peak_vram_mb": 1000.0})
    assert b.reason.endswith("peak_vram_mb not printed")
    (b,) = breaches([g], {"peak_vram_mb": float("nan")}, {"peak_vram_mb": 1000.0})   # nan never holds
    assert missing_in_baseline([g, parse_guard("num_params_M <= 120")], {"peak_vram_mb": 1.0}) == ["num_params_M"]


def test_summary_lines_without_a_block_count_too():
    # A foreign command prints NAME: value lines anywhere; the block after '---' wins.
    tail = "step 1 | loss: 3\nscore: 2.5\nmem_mb: 10\n---\nval_bpb: 1.0\nmem_mb: 12\n"
    assert _parse_summary(tail) == {"score": 2.5, "mem_mb": 12.0, "val_bpb": 1.0}


# ------------------------------------------------------------------------------ the keep rule

MEM = (parse_guard("peak_vram_mb <= 1.10 * baseline"),)


@pytest.mark.parametrize("guards,metrics,runs,status,action,in_reason", [
    (MEM, {"peak_vram_mb": 2000.0}, (1.0,), "discard", "discard", "guard peak_vram_mb <= 1.1 * baseline breached"),
    ((), {"peak_vram_mb": 2000.0}, (1.0,), "keep", "keep", "improved"),
    (MEM, {"peak_vram_mb": 1050.0}, (1.0,), "keep", "keep", "improved"),
    (MEM, {}, (1.0,), "discard", "discard", "not printed"),
    (MEM, {"peak_vram_mb": 2000.0}, (3.0,), "discard", "discard", ""),          # worse anyway: the metric's reason
    (MEM, {"peak_vram_mb": 2000.0}, (1.999,), "discard", "discard", "guard"),   # borderline: no confirmation
])
def test_keep_needs_the_metric_and_every_guard(guards, metrics, runs, status, action, in_reason):
    facts = Facts(kind="candidate", commit="c" * 40, runs=runs, parent=("b" * 40, 2.0), current=("b" * 40, 2.0),
                  noise=0.01, rules=Rules(guards=guards), metrics=metrics, baseline_metrics={"peak_vram_mb": 1000.0})
    d = decide(facts)
    assert (d.status, d.action) == (status, action)
    assert in_reason in d.reason
    if "guard" in in_reason:
        assert "2000" in d.reason and "1100" in d.reason and d.best == ("b" * 40, 2.0)
        assert d.extra["guard_breaches"][0]["guard"] == "peak_vram_mb <= 1.1 * baseline"


# ------------------------------------------------------------------------------ the loop

BIG = GOOD.replace('f"peak_vram_mb:     {1.0:.1f}"', 'f"peak_vram_mb:     {2000.0:.1f}"')
GUARD = "peak_vram_mb <= 1.10 * baseline"


def resume(repo: Path, data_dir: Path, *extra: str):
    return autoloop(repo, *run_args(), "--resume", *extra, data_dir=data_dir)


def test_a_win_that_breaks_a_memory_guard_is_discarded(baselined_repo, tiny_data_dir):
    assert BIG != GOOD
    repo = baselined_repo
    queue_file(repo, "01_big.py", BIG, "restore the rates, with a much bigger memory footprint")
    proc = resume(repo, tiny_data_dir, "--guard", GUARD)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    trial = ledger[-1]
    assert trial["status"] == "discard" and trial["metric"] < ledger[0]["metric"] - 1   # it did win on val_bpb
    assert trial["reason"].startswith(f"guard {GUARD.replace('1.10', '1.1')} breached: peak_vram_mb 2000 vs "
                                      f"limit 1.1"), trial["reason"]
    assert trial["metrics"]["peak_vram_mb"] == 2000.0 and ledger[0]["metrics"]["peak_vram_mb"] == 1.0
    assert trial["best"] == ledger[0]["commit"]


def test_the_same_win_is_kept_without_the_guard(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    queue_file(repo, "01_big.py", BIG, "restore the rates, with a much bigger memory footprint")
    proc = resume(repo, tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trial = assert_invariants(repo)[-1]
    assert trial["status"] == "keep" and trial["metrics"]["peak_vram_mb"] == 2000.0


def test_a_malformed_guard_is_refused_before_anything_runs(tmp_path, tiny_data_dir):
    repo = init_repo(tmp_path / "repo", {"train.py": SLOW})
    proc = autoloop(repo, *run_args(), "--guard", "peak_vram_mb =< 1.1 * baseline", data_dir=tiny_data_dir)
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("autoloop: --guard: cannot read"), \
        proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (repo / "results" / "ledger.jsonl").exists()


def test_a_guard_on_a_name_the_baseline_never_prints_is_refused(tmp_path, tiny_data_dir):
    repo = init_repo(tmp_path / "repo", {"train.py": SLOW})
    queue_file(repo, "01_good.py", GOOD, "restore learning rates")
    guard = "tokens_per_second >= 0.9 * baseline"
    proc = autoloop(repo, *run_args(), "--guard", guard, data_dir=tiny_data_dir)
    assert proc.returncode != 0
    line = proc.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("autoloop: --guard: the baseline"), line
    assert "'tokens_per_second'" in line and "peak_vram_mb" in line       # what it does print
    ledger = read_ledger(repo)
    assert [r["kind"] for r in ledger] == ["baseline"]                     # no candidate ran
    assert (repo / "results" / "queue" / "01_good.py").exists()
    # With the baseline recorded, the next start refuses before anything runs.
    again = autoloop(repo, *run_args(), "--resume", "--guard", guard, data_dir=tiny_data_dir)
    assert again.returncode != 0 and again.stderr.strip().startswith("autoloop: --guard: the baseline"), again.stderr
    assert len(read_ledger(repo)) == 1
    # Fixed, the night goes on from the recorded baseline.
    fixed = autoloop(repo, *run_args(), "--resume", "--guard", "peak_vram_mb <= 1.1 * baseline",
                     data_dir=tiny_data_dir)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    ledger = assert_invariants(repo)
    assert [(r["kind"], r["status"]) for r in ledger] == [("baseline", "keep"), ("candidate", "keep")]


# ------------------------------------------------------------------------------ --check

BROKEN_CHECK = f"{sys.executable} -m py_compile train.py"


def test_a_failing_check_costs_no_training_and_goes_back_for_a_fix(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    agent = f"{FAKE_AGENTS / 'syntax_then_fix.py'} {{prompt_file}} {LR_ARGS}"
    proc = autoloop(repo, "run", "--budget", "2", "--timeout", "60", "--tag", "t", "--device", "cpu", "--resume",
                    "--agent-cmd", agent, "--max-trials", "1", "--check", BROKEN_CHECK, data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    rows = [(r["trial"], r["attempt"], r["kind"], r["status"], r["crash"]) for r in ledger[1:]]
    assert rows == [(1, 1, "candidate", "crash", "trivial"), (1, 2, "fix", "keep", None)]
    failed, fixed = ledger[1], ledger[2]
    assert failed["reason"].startswith(f"check failed: {BROKEN_CHECK} (exit 1)"), failed["reason"]
    assert "SyntaxError" in failed["reason"]
    assert failed["training_seconds"] is None and failed["metrics"] == {}
    assert failed["extra"]["checks"]["passed"] is False
    log = (repo / "results" / failed["log_path"]).read_text()
    assert "SyntaxError" in log and "step " not in log                       # the check's output, no training
    assert not (repo / "results" / "runs" / "1-1.result.json").exists()     # nothing evaluated
    prompt = (repo / "results" / "agents" / "1-2.prompt.md").read_text()
    assert "## Fix request" in prompt and "check failed" in prompt and "def broken(:" in prompt
    assert fixed["extra"]["checks"]["passed"] is True and fixed["training_seconds"] >= 1.5
    assert (repo / "train.py").read_text() == set_constants(SLOW, **LRS)


CHEAT = ("import json, os; p = os.environ['AUTOLOOP_RESULT'].replace('.check.result.json', '.result.json'); "
         "open(p, 'w').write(json.dumps({'metric': 'val_bpb', 'value': 0.01, 'val_bpb': 0.01}))")


def test_a_check_that_writes_the_result_file_is_caught(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    queue_file(repo, "01_good.py", GOOD, "restore learning rates")
    proc = resume(repo, tiny_data_dir, "--check", f"{sys.executable} -c \"{CHEAT}\"")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    trial = ledger[-1]
    assert (trial["status"], trial["crash"]) == ("crash", "fundamental")
    assert trial["reason"] == "tampered: results/runs/1-1.result.json", trial["reason"]
    assert trial["metric"] is None and trial["training_seconds"] is None     # nothing trained
    assert trial["best"] == ledger[0]["commit"]
    assert (repo / "results" / "runs" / "1-1.result.json.by-check").exists()


def test_a_check_that_edits_files_is_undone_before_training(baselined_repo, tiny_data_dir):
    # A check that rewrites train.py (or drops a file beside it) must not change what trains.
    repo = baselined_repo
    queue_file(repo, "01_good.py", GOOD, "restore learning rates")
    edit = ("import pathlib; p = pathlib.Path('train.py'); "
            "p.write_text(p.read_text().replace('HEAD_LR = 0.01', 'HEAD_LR = 0.0')); "
            "pathlib.Path('junk.txt').write_text('x')")
    proc = resume(repo, tiny_data_dir, "--check", f"{sys.executable} -c \"{edit}\"")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trial = assert_invariants(repo)[-1]
    assert trial["status"] == "keep" and trial["metric"] < 2.1               # GOOD's rates trained, not the check's
    assert sorted(trial["extra"]["checks"]["wrote"]) == ["junk.txt", "train.py"]
    assert not (repo / "junk.txt").exists()


# ------------------------------------------------------------------------------ drop-in and workers

FOREIGN = '''\
SCORE = 1.0
MEM = 100.0
import time
time.sleep(0.2)
print("loading data")
print(f"score: {SCORE:.6f}")
print(f"peak_vram_mb: {MEM:.1f}")
print(f"tokens_per_second: {1e5 / MEM:.1f}")
'''


def foreign(score: float, mem: float) -> str:
    return FOREIGN.replace("SCORE = 1.0", f"SCORE = {score}").replace("MEM = 100.0", f"MEM = {mem}")


def foreign_args(*extra: str) -> list[str]:
    return ["run", "--budget", "1", "--timeout", "60", "--proposer", "queue", "--tag", "t", "--device", "cpu",
            "--command", f"{sys.executable} train.py", "--metric", "score", "--guard", "peak_vram_mb <= 1.5 * baseline",
            *extra]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_guards_on_a_foreign_command_and_under_workers(tmp_path, tiny_data_dir, workers):
    repo = init_repo(tmp_path / "repo", {"train.py": FOREIGN})
    queue_file(repo, "01_fat.py", foreign(0.5, 400.0), "better score, four times the memory")
    queue_file(repo, "02_lean.py", foreign(0.8, 120.0), "better score, a little more memory")
    proc = autoloop(repo, *foreign_args("--workers", workers), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = read_ledger(repo)
    by = {r["extra"].get("source"): r for r in ledger if r["kind"] == "candidate"}
    fat, lean = by["01_fat.py"], by["02_lean.py"]
    breach = "guard peak_vram_mb <= 1.5 * baseline breached: peak_vram_mb 400 vs limit 150"
    assert fat["status"] == "discard" and breach in fat["reason"], fat["reason"]
    assert lean["status"] == "keep"
    assert lean["metrics"] == {"score": 0.8, "peak_vram_mb": 120.0, "tokens_per_second": 833.3}
    assert git(repo, "rev-parse", "HEAD") == lean["commit"] == ledger[-1]["best"]


def foreign_night(tmp_path: Path, data_dir: Path) -> Path:
    repo = init_repo(tmp_path / "repo", {"train.py": FOREIGN})
    queue_file(repo, "01_fat.py", foreign(0.5, 400.0), "better score, four times the memory")
    queue_file(repo, "02_lean.py", foreign(0.8, 120.0), "better score, a little more memory")
    queue_file(repo, "03_worse.py", foreign(0.9, 90.0), "worse score, less memory")
    proc = autoloop(repo, *foreign_args(), data_dir=data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return repo


def test_status_and_report_show_the_guards_and_the_front(tmp_path, tiny_data_dir):
    repo = foreign_night(tmp_path, tiny_data_dir)
    status = autoloop(repo, "status", data_dir=tiny_data_dir, check=True).stdout
    assert "guards:\n  `peak_vram_mb <= 1.5 * baseline`: breached by 1 attempt: #1 (400 vs 150)" in status, status
    autoloop(repo, "report", data_dir=tiny_data_dir, check=True)
    report = (repo / "results" / "report.md").read_text()
    assert "## Guards" in report and "breached by 1 attempt: #1 (400 vs 150)" in report
    memory = report.split("### score against peak memory (MB)")[1].split("###")[0]
    # The front against memory: the baseline (100), #2 (0.8 at 120) and #3 (0.9 at 90); #1 is a
    # discard but on the front too (best score, most memory). Kept rows marked.
    assert "| #2 | 0.800000 | 120 | kept |" in memory and "| #0 | 1.000000 | 100 | kept |" not in memory
    assert "| #3 | 0.900000 | 90 |  |" in memory and "| #1 | 0.500000 | 400 |  |" in memory
    assert "Kept but off the front: #0" in memory
    assert "### score against tokens/s" in report


def test_the_digest_states_the_guards_and_the_breaches_so_far():
    from autoloop.store.digest import research_digest
    from autoloop.store.ledger import LedgerRecord

    guard = "peak_vram_mb <= 1.1 * baseline"
    common = {"started_at": 0.0, "ended_at": 1.0, "proposer": "queue", "metric_name": "val_bpb"}
    records = [
        LedgerRecord(trial=0, kind="baseline", status="keep", metric=2.0, commit="a" * 40, best="a" * 40,
                     best_metric=2.0, description="baseline", metrics={"peak_vram_mb": 1000.0}, **common),
        LedgerRecord(trial=1, status="discard", metric=1.5, commit="b" * 40, best="a" * 40, best_metric=2.0,
                     description="wider model", reason=f"guard {guard} breached: ...",
                     extra={"guards": [guard], "guard_breaches": [{"guard": guard, "value": 2000.0, "limit": 1100.0}]},
                     **common),
    ]
    digest = research_digest(records, guards=[guard, "num_params_M <= 120"])
    assert "## Guards (a keep must also meet each" in digest
    assert f"- `{guard}`: breached by 1 attempt: #1 (2000 vs 1100)" in digest
    assert "- `num_params_M <= 120`: no breach so far" in digest
    assert "## Guards" not in research_digest(records[:1])   # no guard given or recorded: no section
