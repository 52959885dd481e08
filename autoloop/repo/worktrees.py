"""Parallel workers' git worktrees: ``worktrees/w<k>`` on branch ``autoloop/<tag>-w<k>``;
and the look-ahead's: ``worktrees/ahead`` (``worktrees/w<k>-ahead``) on ``autoloop/<tag>-ahead``.

Each worker slot of the engine (N > 1) works in a linked worktree of its own, so that its
proposer, commits and trial never touch another's files. The main checkout keeps the loop's
branch ``autoloop/<tag>``, which always shows the best. A slot that looks ahead (--lookahead) has one
more, where the next trial is proposed while its trial runs. Worktrees are made at start (an
existing one is kept: it may hold an interrupted attempt's edit, which recovery saves) and
removed, with their branches, at a clean stop.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from git.exc import GitCommandError

from autoloop.core.errors import NightError
from autoloop.core.layout import WORKTREES, ahead_branch_name, branch_name, worker_branch_name
from autoloop.repo.workspace import Workspace, WorkspaceError, _git_error


def worker_workspace(root: Path, worker: int, tag: str, target: str, results_dir: Path) -> Workspace:
    """Worker k's worktree as a Workspace: its own branch; the loop's and the other workers'
    branches are moved by others meanwhile (not the proposer's doing, for git reconciliation)."""
    return Workspace(worktree_path(root, worker), target, results_dir, branch=worker_branch_name(tag, worker),
                     foreign_refs=(f"refs/heads/{branch_name(tag)}",))


def worktree_path(root: Path, worker: int) -> Path:
    return Path(root) / WORKTREES / f"w{worker}"


def ahead_path(root: Path, worker: int | None) -> Path:
    return Path(root) / WORKTREES / ("ahead" if worker is None else f"w{worker}-ahead")


def ahead_workspace(root: Path, worker: int | None, tag: str, target: str, results_dir: Path) -> Workspace:
    """A slot's look-ahead worktree as a Workspace. Every autoloop/<tag>* branch is moved by
    the loop meanwhile (the slot's own among them), not by the proposer working here."""
    return Workspace(ahead_path(root, worker), target, results_dir, branch=ahead_branch_name(tag, worker),
                     foreign_refs=(f"refs/heads/{branch_name(tag)}",))


def ensure_ahead_worktree(main: Workspace, worker: int | None, tag: str, at: str) -> None:
    _ensure(main, ahead_path(main.root, worker), ahead_branch_name(tag, worker), at)


def remove_ahead_worktree(main: Workspace, worker: int | None, tag: str) -> None:
    _remove(main, ahead_path(main.root, worker), ahead_branch_name(tag, worker))


def ensure_worktrees_ignored(ws: Workspace) -> None:
    """worktrees/ must be ignored by the main checkout (else its clean-tree check, scope
    check and resets would see the workers' files): added to .git/info/exclude when the
    user's .gitignore does not already ignore it."""
    try:
        try:
            ws.repo.git.check_ignore("-q", f"{WORKTREES}/w0/probe")
            return
        except GitCommandError as err:
            if err.status != 1:
                raise
        common = Path(ws.repo.git.rev_parse("--git-common-dir"))
    except GitCommandError as err:
        raise NightError(f"cannot ignore {WORKTREES}/: {_git_error(err)}") from None
    exclude = (common if common.is_absolute() else ws.root / common) / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    text = exclude.read_text() if exclude.exists() else ""
    exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n")
                       + f"# autoloop parallel workers' git worktrees\n/{WORKTREES}/\n")


def ensure_worktree(main: Workspace, worker: int, tag: str, at: str) -> None:
    """Worker k's worktree, created at `at` when missing (a folder left half-made by a kill
    is replaced). An existing one is left as it is: it may hold an interrupted attempt's
    edit, which recovery saves."""
    _ensure(main, worktree_path(main.root, worker), worker_branch_name(tag, worker), at)


def _ensure(main: Workspace, path: Path, branch: str, at: str) -> None:
    if (path / ".git").is_file():
        try:
            existing = Workspace(path)
            ok = existing.root == path.resolve()
            existing.close()
            if ok:
                return
        except WorkspaceError:
            pass   # a worktree git no longer knows: made again
    if path.exists():
        shutil.rmtree(path)
    try:
        main.repo.git.worktree("prune")
        main.repo.git.worktree("add", "-q", "-f", "-B", branch, str(path), at)
    except GitCommandError as err:
        raise NightError(f"cannot create the worker worktree {path}: {_git_error(err)}") from None


def remove_worktree(main: Workspace, worker: int, tag: str) -> None:
    """Worker k's worktree and branch, gone (a clean stop: everything is in the ledger,
    the trial refs and results/)."""
    _remove(main, worktree_path(main.root, worker), worker_branch_name(tag, worker))


def _remove(main: Workspace, path: Path, branch: str) -> None:
    try:
        main.repo.git.worktree("remove", "--force", str(path))
    except GitCommandError:
        shutil.rmtree(path, ignore_errors=True)
        main.repo.git.worktree("prune")
    try:
        main.repo.git.branch("-D", branch)
    except GitCommandError:
        pass
