"""An agent misbehaving with git: the real loop, real git, fake agents that commit, amend,
switch branch, reset, `git rm` or half-stage (tests/fake_agents/git_*.py).

The trial command is a fake train.py whose val_bpb is X + Y, so keep and discard follow
from the constants the agents set: no training, each night takes a few seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers.git import git, init_repo
from helpers.loop import assert_invariants, autoloop, read_ledger

from autoloop.repo import reconcile
from autoloop.repo.workspace import Workspace

FAKE = Path(__file__).resolve().parent / "fake_agents"
TRAIN = "X = 1.0\nY = 1.0\nprint(f'val_bpb: {X + Y}')\n"


def night(repo: Path, data_dir: Path, agent: str, *extra: str, resume: bool = True) -> subprocess.CompletedProcess:
    """One `autoloop run` with the agent (a fake_agents script and its arguments)."""
    proc = autoloop(repo, "run", "--proposer", "agent", "--agent-cmd", f"{FAKE / agent}",
                    "--command", f"{sys.executable} train.py", "--budget", "2", "--timeout", "60",
                    "--tag", "t", "--max-trials", "1", *(["--resume"] if resume else []), *extra,
                    data_dir=data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture
def repo(tmp_path) -> Path:
    return init_repo(tmp_path / "repo", {"train.py": TRAIN})


@pytest.fixture
def kept(repo, tiny_data_dir) -> Path:
    """A night with a baseline (2.0) and a kept agent trial (Y=0.5: 1.5) at HEAD."""
    night(repo, tiny_data_dir, "improve.py Y=0.5", resume=False)
    ledger = read_ledger(repo)
    assert [r["status"] for r in ledger] == ["keep", "keep"]
    return repo


def last(repo: Path) -> dict:
    return read_ledger(repo)[-1]


def agent_refs(repo: Path) -> dict[str, str]:
    out = git(repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/autoloop/t/agent/")
    return dict(line.split() for line in out.splitlines())


def head_file(repo: Path) -> str:
    return git(repo, "show", "HEAD:train.py") + "\n"


# ------------------------------------------------------------------------------ one misbehaviour each


def test_own_commits_become_one_candidate(repo, tiny_data_dir):
    proc = night(repo, tiny_data_dir, "git_commit.py X=0.25", resume=False)
    trial = last(repo)
    assert (trial["trial"], trial["status"], trial["metric"]) == (1, "keep", 1.25)
    # No description file: the agent's commit subjects say what it did.
    assert trial["description"] == "set X=0.25; explain the change"
    assert trial["extra"]["git_events"] == ["agent committed 2 commit(s)"]
    assert "#1: git: agent committed 2 commit(s)" in proc.stdout
    # One candidate commit of ours, on top of the baseline, holding the net change.
    ledger = assert_invariants(repo)
    assert git(repo, "rev-parse", "HEAD~1") == ledger[0]["commit"]
    assert "autoloop trial 1.1" in git(repo, "log", "-1", "--format=%B")
    assert "# tuned by the fake agent" in head_file(repo)
    # The agent's own commits are kept under a ref of their own.
    saved = agent_refs(repo)
    assert list(saved) == ["refs/autoloop/t/agent/1-1/head"]
    assert git(repo, "log", "--format=%s", saved["refs/autoloop/t/agent/1-1/head"], "-2").splitlines() == \
        ["explain the change", "set X=0.25"]


def test_amended_kept_commit_is_restored_and_the_edit_judged(kept, tiny_data_dir):
    repo = kept
    best = git(repo, "rev-parse", "HEAD")
    night(repo, tiny_data_dir, "git_amend.py X=2.0")
    trial = last(repo)
    assert (trial["trial"], trial["status"], trial["metric"]) == (2, "discard", 2.5)
    events = trial["extra"]["git_events"]
    assert len(events) == 1 and events[0].startswith("agent rewrote autoloop/t (amend or rebase")
    assert git(repo, "rev-parse", "HEAD") == best          # the kept commit, not the amended one
    assert_invariants(repo)
    amended = agent_refs(repo)["refs/autoloop/t/agent/2-1/head"]
    assert git(repo, "log", "-1", "--format=%s", amended) == "amended by the fake agent"
    assert git(repo, "rev-parse", f"{amended}~1") == git(repo, "rev-parse", f"{best}~1")


def test_reset_backwards_is_undone_and_the_edit_judged(kept, tiny_data_dir):
    repo = kept
    best = git(repo, "rev-parse", "HEAD")
    night(repo, tiny_data_dir, "git_reset_back.py X=0.8")
    trial = last(repo)
    # The work tree the agent left (the baseline's Y=1.0 and its X=0.8) is the candidate:
    # worse than the kept Y=0.5, so discarded; the kept commit stays the best.
    assert (trial["status"], trial["metric"]) == ("discard", 1.8)
    events = trial["extra"]["git_events"]
    assert len(events) == 1 and events[0].startswith("agent reset autoloop/t back 1 commit(s)")
    assert git(repo, "rev-parse", "HEAD") == best
    assert "Y = 0.5" in head_file(repo)
    assert_invariants(repo)


@pytest.mark.parametrize("branch", ["agent-work", "main"])
def test_switched_branch_is_undone_and_the_edit_judged(repo, tiny_data_dir, branch):
    main_before = git(repo, "rev-parse", "main")
    night(repo, tiny_data_dir, f"git_switch_branch.py {branch} X=0.5", resume=False)
    trial = last(repo)
    assert (trial["status"], trial["metric"], trial["description"]) == ("keep", 1.5, "edit on another branch")
    events = trial["extra"]["git_events"]
    assert events[:2] == [f"agent switched to branch {branch}", f"agent committed 1 commit(s) on {branch}"]
    if branch == "main":
        # The user's branch is put back where it was; the agent's commit there is kept aside.
        assert events[2].startswith("agent moved branch main to ")
        assert "refs/autoloop/t/agent/1-1/moved/heads/main" in agent_refs(repo)
    else:
        assert events[2] == "agent created branch agent-work (left in place)"
    assert git(repo, "rev-parse", "main") == main_before
    assert_invariants(repo)


def test_failed_agent_on_another_branch_leaves_that_branch_alone(repo, tiny_data_dir):
    main_before = git(repo, "rev-parse", "main")
    night(repo, tiny_data_dir, "git_switch_branch.py main fail X=0.5", "--max-agent-failures", "1", resume=False)
    trial = last(repo)
    assert trial["status"] == "skip" and trial["reason"].startswith("agent exited with code 2")
    assert trial["extra"]["git_events"][0] == "agent switched to branch main"
    assert git(repo, "rev-parse", "main") == main_before
    assert (repo / "train.py").read_text() == TRAIN
    assert_invariants(repo)


def test_detached_head_is_undone(repo, tiny_data_dir):
    night(repo, tiny_data_dir, "git_detach.py X=0.5", resume=False)
    trial = last(repo)
    assert (trial["status"], trial["metric"]) == ("keep", 1.5)
    detached = agent_refs(repo)["refs/autoloop/t/agent/1-1/head"]   # the agent's commit, kept
    assert trial["extra"]["git_events"] == [
        f"agent detached HEAD at {detached[:7]}", "agent committed 1 commit(s) on a detached HEAD"]
    assert_invariants(repo)


@pytest.mark.parametrize("commit", [False, True])
def test_deleted_target_is_a_skip(repo, tiny_data_dir, commit):
    proc = night(repo, tiny_data_dir, "git_rm_target.py" + (" commit" if commit else ""),
                 "--max-agent-failures", "1", resume=False)
    trial = last(repo)
    assert (trial["trial"], trial["status"], trial["reason"]) == (1, "skip", "agent deleted train.py")
    events = trial["extra"]["git_events"]
    assert events[-1] == "agent deleted train.py"
    assert ("agent committed 1 commit(s)" in events) == commit
    assert "#1 skipped: agent deleted train.py" in proc.stdout
    assert (repo / "train.py").read_text() == TRAIN
    assert_invariants(repo)


def test_half_staged_index_commits_the_work_tree_target_alone(repo, tiny_data_dir):
    night(repo, tiny_data_dir, "git_half_stage.py X=0.5", resume=False)
    trial = last(repo)
    assert (trial["status"], trial["metric"]) == ("keep", 1.5)   # the work tree's X, not the staged draft's
    assert trial["extra"]["git_events"] == [
        "agent staged files other than train.py: notes.txt (unstaged)",
        "agent left train.py half-staged (index reset; the work tree's version is the candidate)"]
    assert trial["outside_changes"] == ["notes.txt"]
    assert git(repo, "show", "--name-only", "--format=", "HEAD") == "train.py"
    assert (repo / "results" / "quarantine" / "1-1" / "notes.txt").read_text() == "first notes\nsecond thoughts\n"
    # The staged index is kept too: its draft of train.py and the first notes.
    index = agent_refs(repo)["refs/autoloop/t/agent/1-1/index"]
    assert git(repo, "show", f"{index}:notes.txt") == "first notes"
    assert git(repo, "show", f"{index}:train.py").endswith("# draft")
    assert_invariants(repo)


def test_well_behaved_agent_has_no_git_events(repo, tiny_data_dir):
    proc = night(repo, tiny_data_dir, "improve.py X=0.5", resume=False)
    assert "git_events" not in last(repo)["extra"] and ": git:" not in proc.stdout
    assert agent_refs(repo) == {}


def test_trial_command_takes_a_self_driving_agents_commits(repo, tiny_data_dir):
    """`autoloop trial` after the agent committed its edit itself: the commit is the change tried."""
    def trial(message: str) -> subprocess.CompletedProcess:
        return autoloop(repo, "trial", "-m", message, "--command", f"{sys.executable} train.py", "--budget", "2",
                        "--tag", "t", data_dir=tiny_data_dir)

    (repo / "train.py").write_text(TRAIN.replace("X = 1.0", "X = 0.5"))
    assert trial("lower X").returncode == 0
    best = git(repo, "rev-parse", "HEAD")
    (repo / "train.py").write_text(TRAIN.replace("X = 1.0", "X = 0.25"))
    git(repo, "commit", "-q", "-am", "lower X again")
    proc = trial("lower X again")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "git: agent committed 1 commit(s)" in proc.stdout
    record = last(repo)
    assert (record["status"], record["metric"]) == ("keep", 1.25)
    assert record["extra"]["git_events"] == ["agent committed 1 commit(s)"]
    assert git(repo, "rev-parse", "HEAD~1") == best
    assert_invariants(repo)

    git(repo, "rm", "-q", "train.py")
    proc = trial("nothing")
    assert proc.returncode == 1 and proc.stderr.startswith("autoloop: train.py not found in ")
    assert len(proc.stderr.splitlines()) == 1


# ------------------------------------------------------------------------------ reconcile alone


def test_reconcile_restores_deleted_refs_and_abandons_a_merge(repo):
    """No loop: an agent that deleted the loop's branch and a tag from a detached HEAD and
    left a conflicted merge behind."""
    git(repo, "checkout", "-q", "-b", "side")
    (repo / "train.py").write_text(TRAIN.replace("Y = 1.0", "Y = 3.0"))
    git(repo, "commit", "-q", "-am", "side")
    git(repo, "checkout", "-q", "-b", "autoloop/t", "main")
    git(repo, "tag", "v1")
    base = git(repo, "rev-parse", "HEAD")
    ws = Workspace(repo)
    before = reconcile.snapshot(ws, "t")
    # The agent: a commit, a conflicting merge, a detached HEAD, the branch and tag deleted.
    (repo / "train.py").write_text(TRAIN.replace("Y = 1.0", "Y = 2.0"))
    git(repo, "commit", "-q", "-am", "mine")
    subprocess.run(["git", "merge", "-q", "side"], cwd=repo, capture_output=True, check=False)  # conflicts
    assert (repo / ".git" / "MERGE_HEAD").exists()
    git(repo, "update-ref", "--no-deref", "HEAD", git(repo, "rev-parse", "HEAD"))
    git(repo, "branch", "-q", "-D", "autoloop/t")
    git(repo, "tag", "-d", "v1")

    out = reconcile.reconcile(ws, "t", base, 5, 1, before)
    assert git(repo, "symbolic-ref", "HEAD") == "refs/heads/autoloop/t"
    assert git(repo, "rev-parse", "HEAD") == base and git(repo, "rev-parse", "v1") == base
    assert not (repo / ".git" / "MERGE_HEAD").exists()
    assert git(repo, "diff", "--cached", "--name-only") == ""            # index == base
    assert "<<<<<<<" in out.target_text                                  # the work tree, untouched
    assert out.events[0] == "agent left a merge in progress (abandoned, work tree kept)"
    assert any(e.startswith("agent left unmerged paths: train.py") for e in out.events)
    assert any(e.startswith("agent detached HEAD at") for e in out.events)
    assert "agent deleted branch autoloop/t (restored at the best" in " ".join(out.events)
    assert "agent deleted tag v1 (restored)" in out.events
    assert git(repo, "log", "-1", "--format=%s", "refs/autoloop/t/agent/5-1/head") == "mine"
    ws.close()


# ------------------------------------------------------------------------------ recovery


def wait_for(path: Path, proc: subprocess.Popen, seconds: float = 120) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"{path} never appeared")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("switch", [False, True])
def test_sigkill_during_the_agent_then_resume_ends_the_whole_agent_tree(repo, tiny_data_dir, tmp_path, switch):
    night(repo, tiny_data_dir, "no_change.py", "--max-agent-failures", "1", resume=False)   # the baseline
    best = git(repo, "rev-parse", "HEAD")
    pids_file = tmp_path / "pids"
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(tiny_data_dir), "AUTOLOOP_DEVICE": "cpu"}
    agent = f"{FAKE / 'spawn_and_sleep.py'} {pids_file}" + (" switch agent-work" if switch else "")
    cmd = [sys.executable, "-m", "autoloop.cli", "run", "--proposer", "agent", "--agent-cmd", agent,
           "--command", f"{sys.executable} train.py", "--budget", "2", "--tag", "t", "--resume", "--noise-runs", "0"]
    orchestrator = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
    pids = [int(p) for p in wait_for(pids_file, orchestrator).split()]
    orchestrator.send_signal(signal.SIGKILL)
    orchestrator.communicate()
    assert all(alive(pid) for pid in pids)   # the agent, its child and its detached child

    proc = night(repo, tiny_data_dir, "improve.py X=0.25")
    assert "recovery: ended 3 process(es)" in proc.stdout
    assert not any(alive(pid) for pid in pids)
    ledger = assert_invariants(repo)
    assert [(r["trial"], r["status"]) for r in ledger[1:]] == [(1, "skip"), (2, "crash"), (3, "keep")]
    interrupted = ledger[2]
    assert interrupted["reason"] == "interrupted (orchestrator stopped during proposing)"
    assert ledger[3]["parent"] == best and ledger[3]["metric"] == 1.25
    if switch:
        # The agent's branch and commit stay; its edit is the interrupted candidate, kept
        # under the trial's ref on top of the best.
        # (The refs snapshot persisted before the call also tells the branch it created.)
        assert interrupted["extra"]["git_events"] == [
            "agent switched to branch agent-work", "agent committed 1 commit(s) on agent-work",
            "agent created branch agent-work (left in place)"]
        assert "recovery: git: agent switched to branch agent-work" in proc.stdout
        assert git(repo, "rev-parse", f"{interrupted['commit']}~1") == best
        assert "X = 0.5" in git(repo, "show", f"{interrupted['commit']}:train.py")
        assert git(repo, "log", "-1", "--format=%s", "agent-work") == "agent's own commit"
        assert git(repo, "rev-parse", "main") == best
    else:
        assert interrupted["commit"] is None and "git_events" not in interrupted["extra"]
