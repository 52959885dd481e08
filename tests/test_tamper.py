"""The measurement out of the agent's reach: what an agent (or a trial) does to git's own
configuration, to the records and to the target is undone, refused or reported, never
trusted. Real fake agents (tests/fake_agents/), the real CLI, real git."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.git import init_repo
from helpers.loop import BUDGET, LR_ARGS, assert_invariants, autoloop

from autoloop.repo.workspace import Workspace
from autoloop.store.ledger import Ledger, LedgerRecord

FAKE = Path(__file__).resolve().parent / "fake_agents"
SCRIPT = "LR = 0.1\nprint('val_bpb: 1.0')\n"


def agent_run(repo: Path, data_dir: Path, agent_cmd: str, *extra: str):
    return autoloop(repo, "run", "--budget", BUDGET, "--timeout", "60", "--tag", "t", "--device", "cpu",
                    "--resume", "--agent-cmd", agent_cmd, *extra, data_dir=data_dir)


# ------------------------------------------------------------------------------ git's own configuration


@pytest.mark.slow
def test_an_agents_hooks_and_fsmonitor_never_run_and_are_put_back(baselined_repo, tiny_data_dir, tmp_path):
    repo, markers = baselined_repo, tmp_path / "markers"
    markers.mkdir()
    config_before = (repo / ".git" / "config").read_text()
    proc = agent_run(repo, tiny_data_dir, f"{FAKE / 'git_hooks.py'} {markers} {LR_ARGS}", "--max-trials", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # autoloop committed, moved refs and ran status twice after each call: nothing ran.
    assert sorted(p.name for p in markers.iterdir()) == ["fsmonitor.sh"]
    assert (repo / ".git" / "config").read_text() == config_before
    assert not (repo / ".git" / "hooks" / "post-commit").exists()
    assert not (repo / ".git" / "hooks" / "reference-transaction").exists()
    ledger = assert_invariants(repo)
    assert sorted(p.name for p in markers.iterdir()) == ["fsmonitor.sh"]   # nor in the test's own git
    planted = [".git/config", ".git/hooks/post-commit", ".git/hooks/reference-transaction"]
    # Each call's plants, found and put back right after it (a skipped proposal's too).
    assert [r["extra"].get("git_config_changed") for r in ledger[1:]] == [planted] * (len(ledger) - 1), ledger
    assert ledger[1]["status"] == "keep"                    # the change itself was judged on train.py
    evidence = repo / "results" / "quarantine" / "1-1-tampered" / ".git"
    assert (evidence / "hooks" / "post-commit").is_file() and "fsmonitor" in (evidence / "config").read_text()
    assert "git's own configuration changed (.git/config, .git/hooks/post-commit" in proc.stdout


# ------------------------------------------------------------------------------ the records


def _night(repo: Path, data_dir: Path, *extra: str):
    return autoloop(repo, "run", "--budget", BUDGET, "--timeout", "60", "--tag", "t", "--device", "cpu",
                    "--resume", "--proposer", "mutate", *extra, data_dir=data_dir)


def _forge(repo: Path, **changes) -> str:
    """A record as an agent would append it: the last one, claiming a far better metric."""
    lines = (repo / "results" / "ledger.jsonl").read_text().splitlines()
    record = {**json.loads(lines[-1]), "trial": 99, "status": "keep", "metric": 0.001, "best_metric": 0.001,
              "description": "forged", **changes}
    record.pop("chain", None)
    return json.dumps(record)


@pytest.mark.slow
def test_a_forged_ledger_line_is_reported_and_never_the_best(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    ledger = repo / "results" / "ledger.jsonl"
    with open(ledger, "a") as f:
        f.write(_forge(repo) + "\n")
    forged_line = len(ledger.read_text().splitlines())
    status = autoloop(repo, "status", data_dir=tiny_data_dir)
    assert f"ledger.jsonl line {forged_line}: a record without the ledger's chain" in status.stdout, status.stdout
    assert "0.001" not in status.stdout
    report = autoloop(repo, "report", data_dir=tiny_data_dir)
    assert report.returncode == 0 and f"ledger.jsonl line {forged_line}" in report.stdout, report.stdout
    assert "forged" not in (repo / "results" / "report.md").read_text().split("## Records autoloop did not write")[-1] \
        .split("\n", 3)[-1]
    proc = _night(repo, tiny_data_dir, "--max-trials", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ledger.jsonl line {forged_line}" in proc.stdout
    records = Ledger(repo / "results").records()
    assert all(r.description != "forged" for r in records)
    assert records[-1].best_metric != 0.001 and "forged" not in (repo / "results" / "results.tsv").read_text()


def test_an_edited_line_and_a_well_forged_one_are_found_by_the_chain(tmp_path):
    """Edited in place (metric improved), and appended with the chain recomputed as this
    module does: the next record the orchestrator writes leaves the latter out."""
    ledger = Ledger(tmp_path)
    ledger.sole_writer = True
    told: list[str] = []
    ledger.notice = told.append
    for trial in range(3):
        ledger.append(_record(trial, 2.0 - trial * 0.1))
    lines = ledger.path.read_text().splitlines()
    lines[1] = lines[1].replace('"metric":1.9', '"metric":0.5')
    assert '"metric":0.5' in lines[1]
    ledger.path.write_text("\n".join(lines) + "\n")
    assert [b.lineno for b in ledger.breaks()] == [2]
    assert "edited" in ledger.breaks()[0].why and [r.trial for r in ledger.records()] == [0, 2]
    # A well-forged append: chained to the file's last line exactly as autoloop would.
    from autoloop.store import chain
    head = chain.verify(list(enumerate(ledger.path.read_bytes().splitlines(), 1))).head
    body = _record(7, 0.001).model_dump_json(exclude={"chain"})
    with open(ledger.path, "a") as f:
        f.write(chain.seal(head, body) + "\n")
    assert [b.lineno for b in ledger.breaks()] == [2]      # the chain alone cannot tell yet
    ledger.append(_record(3, 1.7))                          # the orchestrator's next record
    assert [b.lineno for b in ledger.breaks()] == [2, 4]
    assert [r.trial for r in ledger.records()] == [0, 2, 3]
    assert any("line 4: left out of the chain" in line for line in told), told


def test_a_forged_results_tsv_row_is_found_against_its_regeneration(tmp_path):
    ledger = Ledger(tmp_path)
    for trial in range(2):
        ledger.append(_record(trial, 2.0 - trial * 0.1))
    assert ledger.integrity_lines() == []
    tsv = tmp_path / "results.tsv"
    rows = tsv.read_text().splitlines()
    tsv.write_text("\n".join([*rows, "abcdef0\t0.001000\t1.0\tkeep\tforged\t-\t9\t1.0\t-\t-\t-"]) + "\n")
    assert ledger.tsv_differences() == [4]
    assert ledger.integrity_lines() == ["results.tsv line 4: not what the ledger gives (edited by hand or by an "
                                        "agent); the ledger is the truth, the file is rewritten from it at the "
                                        "next record"]
    ledger.append(_record(2, 1.7))
    assert ledger.tsv_differences() == [] and "forged" not in tsv.read_text()


def test_a_ledger_from_before_the_chain_loads_and_the_chain_starts_there(tmp_path):
    ledger = Ledger(tmp_path)
    old = [_record(t, 2.0).model_dump_json(exclude={"chain"}) for t in range(2)]
    ledger.path.write_text("\n".join(old) + "\n")
    assert [r.trial for r in ledger.records()] == [0, 1] and ledger.breaks() == []
    ledger.append(_record(2, 1.9))
    assert [r.trial for r in ledger.records()] == [0, 1, 2] and ledger.breaks() == []
    with open(ledger.path, "a") as f:
        f.write(old[0] + "\n")                              # an unchained line after the chain started
    assert [b.lineno for b in ledger.breaks()] == [4]


def _record(trial: int, metric: float) -> LedgerRecord:
    return LedgerRecord(trial=trial, started_at=1.0, ended_at=2.0, proposer="mutate", commit=f"{trial:040x}",
                        description=f"change {trial}", status="keep", metric=metric, best=f"{trial:040x}",
                        best_metric=metric)


# ------------------------------------------------------------------------------ the target itself


def _link(kind: str, repo: Path, outside: Path) -> None:
    target = repo / "train.py"
    if kind == "symlink":
        outside.write_text(target.read_text())
        target.unlink()
        target.symlink_to(outside)
    elif kind == "hardlink":
        os.link(target, outside)
    else:
        target.unlink()
        target.mkdir()
        (target / "x.py").write_text("print(1)\n")


@pytest.mark.parametrize("kind, said", [("symlink", "train.py is a symbolic link"),
                                        ("hardlink", "train.py has 1 other hard link"),
                                        ("folder", "train.py is a folder")])
def test_a_linked_or_folder_target_is_refused_at_start_with_one_line(tmp_path, tiny_data_dir, kind, said):
    repo = init_repo(tmp_path / "repo", {"train.py": SCRIPT})
    _link(kind, repo, tmp_path / "elsewhere.py")
    proc = autoloop(repo, "run", "--budget", BUDGET, "--tag", "t", "--proposer", "mutate", data_dir=tiny_data_dir)
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "folder"])
def test_a_target_linked_during_a_call_or_a_run_is_put_back_and_kept(tmp_path, kind):
    repo = init_repo(tmp_path / "repo", {"train.py": SCRIPT})
    ws = Workspace(repo)
    _link(kind, repo, tmp_path / "elsewhere.py")
    why = ws.undo_run_writes(tmp_path / "quarantine")
    assert "train.py" in why
    assert ws.target_refusal() is None and (repo / "train.py").read_text() == SCRIPT
    assert os.lstat(repo / "train.py").st_nlink == 1
    assert os.path.lexists(tmp_path / "quarantine" / "train.py")
    ws.close()
