"""Workspace against real git repositories in temporary folders."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers.git import git, init_repo

from autoloop.repo.workspace import Workspace, WorkspaceError

TRAIN = "lr = 0.1\nsteps = 10\nprint('train')\n"


@pytest.fixture
def repo(tmp_path) -> Path:
    return init_repo(tmp_path / "repo", {"train.py": TRAIN, "util.py": "x = 1\n", "pkg/mod.py": "y = 2\n"})


@pytest.fixture
def ws(repo) -> Workspace:
    w = Workspace(repo)
    yield w
    w.close()


def edit_target(ws: Workspace, text: str = "lr = 0.2\nsteps = 10\nprint('train')\n") -> None:
    ws.target_path.write_text(text)


# ------------------------------------------------------------------ opening


def test_not_a_git_repository(tmp_path):
    with pytest.raises(WorkspaceError, match=r"^not a git repository: .*autoloop init DIR"):
        Workspace(tmp_path)


def test_no_commits_yet(tmp_path):
    git(tmp_path, "init", "-q")
    with pytest.raises(WorkspaceError, match="no commits yet"):
        Workspace(tmp_path)


def test_bare_repository(tmp_path):
    git(tmp_path, "init", "-q", "--bare")
    with pytest.raises(WorkspaceError, match="bare"):
        Workspace(tmp_path)


def test_finds_root_from_subdirectory(repo):
    ws = Workspace(repo / "pkg")
    assert ws.root == repo.resolve()
    assert ws.target_path == repo.resolve() / "train.py"
    assert ws.results_dir == repo.resolve() / "results"
    ws.check_target()


def test_missing_target(repo):
    ws = Workspace(repo, target="model.py")
    with pytest.raises(WorkspaceError, match=r"^model.py not found in "):
        ws.check_target()


def test_untracked_target(repo):
    (repo / "model.py").write_text("pass\n")
    with pytest.raises(WorkspaceError, match=r"model.py is not committed"):
        Workspace(repo, target="model.py").check_target()


# --------------------------------------------------------------- clean tree


def test_clean_tree_passes(ws):
    assert ws.dirty_paths() == []
    ws.ensure_clean()


def test_dirty_tree_lists_modified_staged_and_untracked(ws, repo):
    (repo / "util.py").write_text("x = 3\n")          # modified
    (repo / "pkg" / "mod.py").write_text("y = 3\n")   # staged
    git(repo, "add", "pkg/mod.py")
    (repo / "new dir").mkdir()
    (repo / "new dir" / "notes.txt").write_text("hi\n")  # untracked, in a new folder, with a space
    assert ws.dirty_paths() == ["new dir/notes.txt", "pkg/mod.py", "util.py"]
    with pytest.raises(WorkspaceError) as info:
        ws.ensure_clean()
    assert str(info.value) == (
        "working tree has uncommitted changes: pkg/mod.py, util.py; and untracked files: new dir/notes.txt "
        "(commit them, or set them aside with git stash -u; add outputs such as run.log to .gitignore)"
    )


def test_untracked_files_alone_are_refused_naming_stash_u_and_gitignore(ws, repo):
    (repo / "run.log").write_text("step 1\n")   # what autoresearch's instructions leave behind
    with pytest.raises(WorkspaceError) as info:
        ws.ensure_clean()
    message = str(info.value)
    assert message.startswith("working tree has untracked files: run.log (") and "\n" not in message
    assert "git stash -u" in message and ".gitignore" in message
    # The advice works: git stash -u sets it aside (plain git stash would not), and brings it back.
    git(repo, "stash", "-u")
    ws.ensure_clean()
    git(repo, "stash", "pop")
    assert (repo / "run.log").read_text() == "step 1\n"


def test_tracked_changes_alone_name_commit_and_stash(ws, repo):
    (repo / "util.py").write_text("x = 3\n")
    with pytest.raises(WorkspaceError) as info:
        ws.ensure_clean()
    assert str(info.value) == \
        "working tree has uncommitted changes: util.py (commit them, or set them aside with git stash)"


def test_ignored_files_do_not_count(ws, repo):
    (repo / "results").mkdir()
    (repo / "results" / "ledger.jsonl").write_text("{}\n")
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert ws.dirty_paths() == []
    ws.ensure_clean()  # raises WorkspaceError on a dirty tree


def test_results_ignored(ws, repo):
    ws.ensure_results_ignored()  # "results/*" in the fixture's .gitignore
    (repo / ".gitignore").write_text("results/*\n!results/README.md\n")
    ws.ensure_results_ignored()  # a tracked readme inside is fine
    (repo / ".gitignore").write_text("__pycache__/\n")
    with pytest.raises(WorkspaceError, match=r"results/ is not git-ignored .*add 'results/' to .gitignore"):
        ws.ensure_results_ignored()


# ----------------------------------------------------------------- branches


def test_branch_create_exists_and_resume(ws):
    base = ws.head()
    assert ws.current_branch() == "main"
    assert not ws.branch_exists("nov29")
    assert ws.start_branch("nov29", resume=False) == base
    assert ws.current_branch() == "autoloop/nov29"
    assert ws.branch_exists("nov29")
    with pytest.raises(WorkspaceError, match=r"^branch autoloop/nov29 exists: pass --resume"):
        ws.start_branch("nov29", resume=False)
    git(ws.root, "checkout", "-q", "main")
    assert ws.start_branch("nov29", resume=True) == base
    assert ws.current_branch() == "autoloop/nov29"


def test_resume_missing_branch(ws):
    with pytest.raises(WorkspaceError, match="does not exist"):
        ws.start_branch("dec01", resume=True)


def test_invalid_tag(ws):
    with pytest.raises(WorkspaceError, match="invalid tag"):
        ws.start_branch("bad..tag", resume=False)


def test_detached_head(ws):
    git(ws.root, "checkout", "-q", "--detach")
    assert ws.current_branch() is None


# ------------------------------------------------------------------ commits


def test_commit_only_the_target_after_revert_out_of_scope(ws, repo, tmp_path):
    ws.start_branch("t", resume=False)
    base = ws.head()
    edit_target(ws)
    (repo / "util.py").write_text("x = 99\n")
    git(repo, "add", "util.py")
    assert ws.target_changed()
    assert ws.revert_out_of_scope(tmp_path / "q") == ["util.py"]
    sha = ws.commit_candidate("raise lr")
    assert sha == ws.head() != base
    assert git(repo, "diff", "--name-only", base, sha).splitlines() == ["train.py"]
    assert ws.commit_message(sha) == "raise lr"
    assert ws.file_at(sha, "train.py").startswith("lr = 0.2")
    assert ws.file_at(sha, "missing.py") is None
    assert ws.file_at(sha, "pkg") is None
    assert ws.dirty_paths() == []
    assert ws.diff_lines(base, sha) == 2
    assert ws.is_ancestor(base, sha) and not ws.is_ancestor(sha, base)
    assert not ws.is_ancestor("0" * 40, sha)


def test_commit_leaves_other_staged_changes_out(ws, repo):
    base = ws.head()
    edit_target(ws)
    (repo / "util.py").write_text("x = 99\n")
    git(repo, "add", "util.py")
    sha = ws.commit_candidate("only the target")
    assert git(repo, "diff", "--name-only", base, sha).splitlines() == ["train.py"]
    assert ws.dirty_paths() == ["util.py"]  # still staged, not lost


def test_commit_without_change_fails(ws):
    assert not ws.target_changed()
    with pytest.raises(WorkspaceError, match="no change"):
        ws.commit_candidate("nothing")


def test_staged_only_change_counts(ws, repo):
    edit_target(ws)
    git(repo, "add", "train.py")
    assert ws.target_changed()


def test_diff_text(ws):
    edit_target(ws)
    text = ws.diff_text()
    assert "-lr = 0.1" in text and "+lr = 0.2" in text and text.endswith("\n")
    assert ws.diff_text(ws.head()) == text


def test_commit_without_global_identity(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    empty = tmp_path / "empty-gitconfig"
    empty.write_text("")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(empty))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)
    repo = tmp_path / "bare-identity"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "train.py").write_text(TRAIN)
    git(repo, "add", "train.py")
    # The first commit names an identity on the command line only; none is stored anywhere.
    git(repo, "-c", "user.name=someone", "-c", "user.email=someone@example.invalid", "-c", "commit.gpgsign=false",
        "commit", "-q", "-m", "initial")
    with pytest.raises(subprocess.CalledProcessError):
        git(repo, "config", "--get", "user.email")

    ws = Workspace(repo)
    edit_target(ws)
    sha = ws.commit_candidate("no identity")
    assert git(repo, "log", "-1", "--format=%an <%ae>|%cn <%ce>", sha) == (
        "autoloop <autoloop@localhost>|autoloop <autoloop@localhost>"
    )
    with pytest.raises(subprocess.CalledProcessError):  # nothing was written to the config
        git(repo, "config", "--get", "user.name")
    ws.close()


def test_configured_identity_is_used(ws, repo):
    edit_target(ws)
    sha = ws.commit_candidate("mine")
    assert git(repo, "log", "-1", "--format=%an", sha) == "autoloop test"


def test_commit_deleted_target(ws, repo):
    ws.target_path.unlink()
    assert ws.target_changed()
    sha = ws.commit_candidate("delete it")
    assert ws.file_at(sha, "train.py") is None


# ---------------------------------------------------------- refs and resets


def test_trial_refs_survive_reset(ws, repo):
    ws.start_branch("nov29", resume=False)
    best = ws.head()
    shas = {}
    for attempt in (1, 2):
        edit_target(ws, f"lr = 0.{attempt + 2}\n")
        sha = ws.commit_candidate(f"try {attempt}")
        ref = ws.save_trial_ref("nov29", 5, attempt, sha)
        shas[ref] = sha
        ws.reset_to(best)
        assert ws.head() == best
    assert list(shas) == ["refs/autoloop/nov29/trials/5-1", "refs/autoloop/nov29/trials/5-2"]
    assert ws.trial_refs("nov29") == shas
    assert ws.trial_refs("other") == {}
    for sha in shas.values():
        assert ws.file_at(sha, "train.py").startswith("lr = 0.")  # still reachable
        assert not ws.is_ancestor(sha, ws.head())


def test_reset_removes_untracked_keeps_ignored(ws, repo):
    base = ws.head()
    edit_target(ws)
    ws.commit_candidate("candidate")
    (repo / "stray.txt").write_text("junk\n")
    (repo / "newdir").mkdir()
    (repo / "newdir" / "f.py").write_text("junk\n")
    (repo / "util.py").write_text("changed\n")
    (repo / "results").mkdir()
    (repo / "results" / "ledger.jsonl").write_text("{\"trial\": 1}\n")
    ws.reset_to(base)
    assert ws.head() == base
    assert ws.target_path.read_text() == TRAIN
    assert (repo / "util.py").read_text() == "x = 1\n"
    assert not (repo / "stray.txt").exists() and not (repo / "newdir").exists()
    assert (repo / "results" / "ledger.jsonl").read_text() == "{\"trial\": 1}\n"
    assert ws.dirty_paths() == []


def test_reset_to_unknown_commit(ws):
    with pytest.raises(WorkspaceError, match="unknown commit"):
        ws.reset_to("deadbeef")


# -------------------------------------------------------------- scope check


def test_revert_out_of_scope(ws, repo, tmp_path):
    q = tmp_path / "quarantine"
    edit_target(ws)
    (repo / "util.py").write_text("x = 'agent'\n")          # modified
    (repo / "pkg" / "mod.py").unlink()                        # deleted
    (repo / ".gitignore").write_text("nothing\n")             # modified and staged
    git(repo, "add", ".gitignore")
    (repo / "helper.py").write_text("def h(): pass\n")        # untracked
    (repo / "deep" / "er").mkdir(parents=True)
    (repo / "deep" / "er" / "notes.md").write_text("idea\n")  # untracked in new folders
    (repo / "staged_new.py").write_text("z = 1\n")            # added to the index
    git(repo, "add", "staged_new.py")

    touched = ws.revert_out_of_scope(q)

    assert touched == [".gitignore", "deep/er/notes.md", "helper.py", "pkg/mod.py", "staged_new.py", "util.py"]
    # Tracked files are back to HEAD, in the index too.
    assert (repo / "util.py").read_text() == "x = 1\n"
    assert (repo / "pkg" / "mod.py").read_text() == "y = 2\n"
    assert (repo / ".gitignore").read_text().startswith("results/*")
    assert git(repo, "diff", "--cached", "--name-only") == ""
    # What the agent wrote is in quarantine, with its relative path.
    assert (q / "helper.py").read_text() == "def h(): pass\n"
    assert (q / "deep" / "er" / "notes.md").read_text() == "idea\n"
    assert (q / "staged_new.py").read_text() == "z = 1\n"
    assert (q / "util.py").read_text() == "x = 'agent'\n"
    assert not (repo / "helper.py").exists() and not (repo / "deep").exists()
    # The target's edit stays, and is the only change left.
    assert ws.target_path.read_text().startswith("lr = 0.2")
    assert ws.dirty_paths() == ["train.py"]


def test_revert_out_of_scope_nothing_to_do(ws, tmp_path):
    edit_target(ws)
    assert ws.revert_out_of_scope(tmp_path / "q") == []
    assert not (tmp_path / "q").exists()


def test_revert_out_of_scope_keeps_staged_target_and_never_overwrites_quarantine(ws, repo, tmp_path):
    q = tmp_path / "q"
    (q).mkdir()
    (q / "helper.py").write_text("earlier\n")
    edit_target(ws)
    git(repo, "add", "train.py")
    (repo / "helper.py").write_text("later\n")
    assert ws.revert_out_of_scope(q) == ["helper.py"]
    assert (q / "helper.py").read_text() == "earlier\n"
    assert (q / "helper.py.1").read_text() == "later\n"
    assert ws.target_changed()


def test_revert_out_of_scope_undoes_agent_commits(ws, repo, tmp_path):
    ws.start_branch("t", resume=False)
    base = ws.head()
    edit_target(ws)
    (repo / "util.py").write_text("x = 'agent'\n")
    git(repo, "commit", "-q", "-am", "agent committed by itself")
    assert ws.revert_out_of_scope(tmp_path / "q", base=base) == ["util.py"]
    assert ws.head() == base
    assert ws.current_branch() == "autoloop/t"
    assert ws.target_changed()
    assert ws.dirty_paths() == ["train.py"]


def test_revert_out_of_scope_sees_through_ignore_tricks(ws, repo, tmp_path):
    q = tmp_path / "q"
    (repo / "results").mkdir()
    (repo / "results" / "ledger.jsonl").write_text("{}\n")
    (repo / ".gitignore").write_text("")  # un-ignores results/: the ledger must stay put
    (repo / "hidden").mkdir()
    (repo / "hidden" / ".gitignore").write_text("payload.py\n")  # hides the payload
    (repo / "hidden" / "payload.py").write_text("secret\n")
    (repo / "nested").mkdir()
    git(repo / "nested", "init", "-q")  # a nested repository moves as a whole
    (repo / "nested" / "f").write_text("f\n")
    touched = ws.revert_out_of_scope(q)
    assert touched == [".gitignore", "hidden/.gitignore", "hidden/payload.py", "nested"]
    assert (repo / "results" / "ledger.jsonl").read_text() == "{}\n"
    assert (q / "hidden" / "payload.py").read_text() == "secret\n"
    assert (q / "nested" / "f").read_text() == "f\n"
    assert ws.dirty_paths() == []


def test_reset_removes_files_hidden_by_untracked_gitignore(ws, repo):
    (repo / "hidden").mkdir()
    (repo / "hidden" / ".gitignore").write_text("payload.py\n")
    (repo / "hidden" / "payload.py").write_text("x\n")
    ws.reset_to(ws.head())
    assert not (repo / "hidden").exists()
