"""The measurement out of the agent's reach: what an agent (or a trial) does to git's own
configuration, to the records and to the target is undone, refused or reported, never
trusted. Real fake agents (tests/fake_agents/), the real CLI, real git."""

from __future__ import annotations

from pathlib import Path

import pytest
from loop_helpers import BUDGET, LR_ARGS, assert_invariants, autoloop

FAKE = Path(__file__).resolve().parent / "fake_agents"


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
