"""`autoloop finalize --push` to a bare repository in a temp folder, and `--pr` through the
GitHub CLI: absent (one line, nothing made), and a stand-in `gh` on PATH that records the
command line and the body it would receive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.gh import stand_in_gh, without_gh
from helpers.git import git
from helpers.night import build_night, realistic_steps


def cli(repo: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoloop.cli", "finalize", *args], cwd=repo, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def bare(tmp_path: Path, name: str = "remote.git") -> Path:
    remote = tmp_path / name
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    return remote


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture
def night(tmp_path):
    return build_night(tmp_path, realistic_steps(), tag="t")


def test_push_to_a_bare_repository_never_the_loops_branch_never_forced(night, tmp_path):
    repo = night.repo
    line = one_line_error(cli(repo, "--push"))
    assert "has no remote" in line and "git remote add origin" in line
    assert not git(repo, "branch", "--list", "autoloop/t-final")   # nothing made before the line
    remote = bare(tmp_path)
    git(repo, "remote", "add", "origin", str(remote))
    proc = cli(repo, "--push")
    assert proc.returncode == 0, proc.stderr
    assert "pushed autoloop/t-final to origin" in proc.stdout
    on_remote = git(remote, "for-each-ref", "--format=%(refname) %(objectname)").splitlines()
    assert on_remote == [f"refs/heads/autoloop/t-final {git(repo, 'rev-parse', 'autoloop/t-final')}"]
    # A branch of that name on the remote with other commits: refused, unless --force.
    git(repo, "push", "-q", str(remote), "autoloop/t:refs/heads/autoloop/t-other")
    line = one_line_error(cli(repo, "--branch", "autoloop/t-other", "--push"))
    assert "has other commits" in line and "--force" in line
    assert git(remote, "rev-parse", "autoloop/t-other") == git(repo, "rev-parse", "autoloop/t")
    proc = cli(repo, "--branch", "autoloop/t-forced", "--push", "origin")
    assert proc.returncode == 0, proc.stderr
    line = one_line_error(cli(repo, "--branch", "autoloop/t-x", "--push", "upstream"))
    assert "no remote named 'upstream'" in line


def test_pr_without_gh_is_one_line_and_makes_nothing(night, tmp_path):
    repo = night.repo
    git(repo, "remote", "add", "origin", str(bare(tmp_path)))
    line = one_line_error(cli(repo, "--pr", env={"PATH": without_gh()}))
    assert line == ("autoloop: --pr: the GitHub CLI (gh) is not installed (https://cli.github.com); "
                    "push with --push and open the pull request by hand")
    assert not git(repo, "branch", "--list", "autoloop/t-final")




def test_pr_with_a_stand_in_gh_gets_the_command_line_and_the_body(night, tmp_path):
    repo = night.repo
    remote = bare(tmp_path)
    git(repo, "remote", "add", "origin", str(remote))
    env, log = stand_in_gh(tmp_path)

    line = one_line_error(cli(repo, "--pr", env={**env, "GH_LOGGED_OUT": "1"}))
    assert "gh is not logged in" in line and "gh auth login" in line
    assert not git(repo, "branch", "--list", "autoloop/t-final")

    log.unlink()
    proc = cli(repo, "--pr", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "pull request: https://github.com/someone/experiment/pull/7" in proc.stdout
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[0]["argv"] == ["auth", "status"]
    argv = calls[1]["argv"]
    assert argv[:4] == ["pr", "create", "--head", "autoloop/t-final"] and argv[4] == "--title"
    assert argv[5] == "autoloop t: val_bpb 1.0275 -> 1.0159 (6 kept changes)" and argv[6] == "--body-file"
    body = calls[1]["body"]
    assert "## Result" in body and "## Kept changes" in body and "MATRIX_LR 0.04 -> 0.06" in body
    assert "## results.tsv" in body and "```diff" in body
    assert "+commit\tval_bpb\tmemory_gb\tstatus\tdescription" in body   # the rows the branch adds
    # It was pushed first (gh opens a pull request of a branch the remote has).
    assert git(remote, "rev-parse", "autoloop/t-final") == git(repo, "rev-parse", "autoloop/t-final")
