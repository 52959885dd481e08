"""Undo what a proposer did to git, keeping what it did to the target.

Coding agents commit on their own, amend, switch branches, reset, `git rm`, stage half a
change, or leave a rebase half done. The loop owns git: after every proposal (success or
failure) :func:`reconcile` puts the repository back into the one state the rest of the
trial relies on, and says what it found:

* the loop's branch ``autoloop/<tag>`` is checked out and points at the best commit,
  the index equals the best commit;
* the work tree is left exactly as the agent left it: its ``train.py`` is the candidate,
  its other edits are the scope check's to revert and quarantine;
* nothing is lost: the agent's own commits (and a staged index that differs from HEAD)
  are saved under ``refs/autoloop/<tag>/agent/<trial>-<attempt>/``; branches, tags and
  trial refs that existed before the proposal and were moved or deleted are put back.
  Branches and tags the agent created are left in place (they lose nothing either).

The work tree is never written here: HEAD is re-pointed with ``symbolic-ref`` and the
index with ``reset --mixed``, so whatever the agent's checkout left on disk is what the
scope check and the commit see.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from git.exc import GitCommandError

from autoloop.core.layout import agent_ref_prefix, trial_ref_prefix
from autoloop.repo.workspace import Workspace, WorkspaceError, _git_error
from autoloop.store.atomic import atomic_write

# The refs an agent must not move or delete (re-created from the snapshot when it did).
_GUARDED = ("refs/heads/", "refs/tags/")
MAX_MESSAGE = 200

# What an interrupted git operation leaves in the git directory; removing these files
# abandons the operation without touching the work tree (the agent's edit stays).
_OPERATIONS = {
    "rebase-merge": "a rebase", "rebase-apply": "a rebase or am", "MERGE_HEAD": "a merge",
    "CHERRY_PICK_HEAD": "a cherry-pick", "REVERT_HEAD": "a revert", "BISECT_START": "a bisect",
}
_OPERATION_FILES = ("rebase-merge", "rebase-apply", "MERGE_HEAD", "MERGE_MSG", "MERGE_MODE", "MERGE_RR",
                    "AUTO_MERGE", "CHERRY_PICK_HEAD", "REVERT_HEAD", "sequencer", "BISECT_START", "BISECT_LOG",
                    "BISECT_TERMS", "BISECT_NAMES", "BISECT_EXPECTED_REV", "BISECT_ANCESTORS_OK", "BISECT_HEAD")


@dataclass
class RefSnapshot:
    """The refs before a proposal: what reconcile puts back if the agent moved them."""

    refs: dict[str, str]          # full ref name -> sha (branches, tags, the tag's trial refs)

    def save(self, path: Path) -> None:
        """Persisted before the proposer runs: a kill -9 during the call must not lose it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(self.refs, indent=0, sort_keys=True))

    @classmethod
    def load(cls, path: Path) -> RefSnapshot | None:
        """The persisted snapshot, None when there is none (or it cannot be read: then the
        agent's moves of existing refs are not put back, its commits are still saved)."""
        try:
            refs = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(refs, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in refs.items()):
            return None
        return cls(refs)


@dataclass
class Reconciled:
    events: list[str] = field(default_factory=list)   # one line each, for the ledger and the console
    target_text: str | None = None    # the target as the agent left it in the work tree; None: gone
    target_deleted: bool = False
    commit_message: str | None = None  # subjects of the agent's own commits on top of the best
    saved_refs: list[str] = field(default_factory=list)


def snapshot(ws: Workspace, tag: str) -> RefSnapshot:
    out = ws.repo.git.for_each_ref("--format=%(refname) %(objectname)", *_GUARDED, trial_ref_prefix(tag))
    refs = {}
    for line in out.splitlines():
        name, _, sha = line.partition(" ")
        # Refs other threads of the loop move meanwhile (parallel workers) are not the agent's doing.
        if name and not name.startswith(ws.foreign_refs or ("\0",)):
            refs[name] = sha
    return RefSnapshot(refs)


def _sha(ws: Workspace, rev: str) -> str | None:
    try:
        return ws.repo.git.rev_parse("-q", "--verify", f"{rev}^{{commit}}").strip() or None
    except GitCommandError:
        return None


def _symbolic_head(ws: Workspace) -> str | None:
    """refs/heads/<name> HEAD points at (possibly unborn), None when HEAD is detached."""
    try:
        return ws.repo.git.symbolic_ref("-q", "HEAD").strip() or None
    except GitCommandError:
        return None


def _count(ws: Workspace, spec: str) -> int:
    return int(ws.repo.git.rev_list("--count", spec).strip() or 0)


def _short(sha: str | None) -> str:
    return sha[:7] if sha else "-"


def _abandon_operations(ws: Workspace, events: list[str]) -> None:
    git_dir = Path(ws.repo.git_dir)
    lock = git_dir / "index.lock"
    if lock.exists():
        # The agent's processes are all ended before we get here: nobody holds it.
        lock.unlink()
        events.append("removed a stale index.lock the agent left")
    found = [what for name, what in _OPERATIONS.items() if (git_dir / name).exists()]
    for name in _OPERATION_FILES:
        path = git_dir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()
    if (git_dir / "refs" / "bisect").exists() or "a bisect" in found:
        for ref in ws.repo.git.for_each_ref("--format=%(refname)", "refs/bisect/").split():
            ws.repo.git.update_ref("-d", ref)
    for what in dict.fromkeys(found):
        events.append(f"agent left {what} in progress (abandoned, work tree kept)")


def _index_events(ws: Workspace, events: list[str]) -> bool:
    """Events for what the agent left staged; True when that is worth saving (staged
    content the work tree may not have)."""
    unmerged, staged_other, half_target = [], [], False
    for xy, path, _ in ws._status():
        if xy == "??":
            continue
        if xy in ("DD", "AU", "UD", "UA", "DU", "AA", "UU"):
            unmerged.append(path)
            continue
        if xy[0] != " ":
            if path != ws.target:
                staged_other.append(path)
            elif xy[1] != " ":
                half_target = True
    if unmerged:
        events.append(f"agent left unmerged paths: {', '.join(sorted(unmerged))} (index reset)")
    if staged_other:
        events.append(f"agent staged files other than {ws.target}: {', '.join(sorted(staged_other))} (unstaged)")
    if half_target:
        events.append(f"agent left {ws.target} half-staged (index reset; the work tree's version is the candidate)")
    return bool(staged_other or half_target) and not unmerged


def _save(ws: Workspace, ref: str, sha: str, saved: list[str]) -> None:
    ws.repo.git.update_ref("-m", "autoloop: kept from the agent", ref, sha)
    saved.append(ref)


def _save_index(ws: Workspace, head_sha: str | None, ref: str, trial: int, attempt: int,
                saved: list[str]) -> None:
    """The staged index as a commit on top of the agent's HEAD: staged content that differs
    from the work tree would otherwise only survive as unreachable blobs."""
    try:
        tree = ws.repo.git.write_tree().strip()
        args = ["-m", f"autoloop: index left by the agent in trial {trial}.{attempt}"]
        if head_sha:
            args += ["-p", head_sha]
        with ws.repo.git.custom_environment(**ws._identity_env()):
            commit = ws.repo.git.commit_tree(tree, *args).strip()
    except GitCommandError:
        return   # an index git cannot write as a tree: its work-tree files are what remains
    _save(ws, ref, commit, saved)


def _subjects(ws: Workspace, base: str, tip: str) -> str | None:
    subjects = [s.strip() for s in ws.repo.git.log("--format=%s", "--reverse", f"{base}..{tip}").splitlines()]
    text = "; ".join(s for s in subjects if s)
    return text[:MAX_MESSAGE] or None


def reconcile(ws: Workspace, tag: str, base: str, trial: int, attempt: int,
              before: RefSnapshot | None = None) -> Reconciled:
    """Bring git back to: branch autoloop/<tag> checked out at `base` (the best commit),
    index == base, guarded refs as in `before`; the work tree untouched. Returns what the
    agent did, one event per finding."""
    try:
        return _reconcile(ws, tag, base, trial, attempt, before)
    except GitCommandError as err:
        raise WorkspaceError(f"cannot undo the proposer's git changes: {_git_error(err)}") from None


def _reconcile(ws: Workspace, tag: str, base: str, trial: int, attempt: int,
               before: RefSnapshot | None) -> Reconciled:
    base = ws._resolve(base)          # a kept commit is held by its trial ref: it exists
    branch_ref = f"refs/heads/{ws.branch_name(tag)}"
    prefix = agent_ref_prefix(tag, trial, attempt)
    out = Reconciled()

    _abandon_operations(ws, out.events)
    head_ref = _symbolic_head(ws)
    head_sha = _sha(ws, "HEAD")
    branch_sha = _sha(ws, branch_ref)
    _save_agent_work(ws, base, prefix, head_sha, branch_sha, trial, attempt, out)
    _note_head(ws, base, branch_ref, head_ref, head_sha, out)
    _note_branch(ws, base, branch_ref, head_ref == branch_ref, branch_sha, out)
    _back_to_best(ws, tag, base, branch_ref, prefix, before, out)
    if ws.target_path.is_file():
        out.target_text = ws.target_path.read_text(errors="replace")
    else:
        out.target_deleted = True
        out.events.append(f"agent deleted {ws.target}")
    return out


def _save_agent_work(ws: Workspace, base: str, prefix: str, head_sha: str | None, branch_sha: str | None,
                     trial: int, attempt: int, out: Reconciled) -> None:
    """Save what the best does not hold under the agent refs: the agent's work, never lost."""
    # What the agent left staged (against its own HEAD), saved before the index is reset.
    if head_sha is not None and _index_events(ws, out.events):
        _save_index(ws, head_sha, prefix + "index", trial, attempt, out.saved_refs)
    # Tips holding commits the best does not.
    if head_sha and not ws.is_ancestor(head_sha, base):
        _save(ws, prefix + "head", head_sha, out.saved_refs)
    if branch_sha and branch_sha != head_sha and not ws.is_ancestor(branch_sha, base):
        _save(ws, prefix + "branch", branch_sha, out.saved_refs)


def _note_head(ws: Workspace, base: str, branch_ref: str, head_ref: str | None, head_sha: str | None,
               out: Reconciled) -> None:
    """Where HEAD went, and the commits made there when it left the loop's branch."""
    if head_ref is None:
        out.events.append(f"agent detached HEAD at {_short(head_sha)}")
    elif head_ref != branch_ref:
        name = head_ref.removeprefix("refs/heads/")
        out.events.append(f"agent switched to branch {name}" + ("" if head_sha else " (unborn)"))
    if head_ref != branch_ref and head_sha and head_sha != base and ws.is_ancestor(base, head_sha):
        n = _count(ws, f"{base}..{head_sha}")
        where = "a detached HEAD" if head_ref is None else head_ref.removeprefix("refs/heads/")
        out.events.append(f"agent committed {n} commit(s) on {where}")
        out.commit_message = _subjects(ws, base, head_sha)


def _note_branch(ws: Workspace, base: str, branch_ref: str, on_branch: bool, branch_sha: str | None,
                 out: Reconciled) -> None:
    """What happened to the loop's branch."""
    branch = branch_ref.removeprefix("refs/heads/")
    if branch_sha is None:
        out.events.append(f"agent deleted branch {branch} (restored at the best {_short(base)})")
    elif branch_sha != base:
        if ws.is_ancestor(base, branch_sha):
            n = _count(ws, f"{base}..{branch_sha}")
            out.events.append(f"agent committed {n} commit(s)" + ("" if on_branch else f" on {branch}"))
            out.commit_message = out.commit_message or _subjects(ws, base, branch_sha)
        elif ws.is_ancestor(branch_sha, base):
            n = _count(ws, f"{branch_sha}..{base}")
            out.events.append(f"agent reset {branch} back {n} commit(s) to {_short(branch_sha)} "
                              f"(restored to the best {_short(base)})")
        else:
            out.events.append(f"agent rewrote {branch} (amend or rebase: {_short(branch_sha)} does not descend "
                              f"from the best {_short(base)}; restored, its commits saved)")


def _back_to_best(ws: Workspace, tag: str, base: str, branch_ref: str, prefix: str, before: RefSnapshot | None,
                  out: Reconciled) -> None:
    """Back to the loop's branch at the best, the work tree untouched."""
    git = ws.repo.git
    git.symbolic_ref("HEAD", branch_ref)
    git.update_ref("-m", "autoloop: back to the best after the proposer", branch_ref, base)
    if before is not None:
        _restore_refs(ws, tag, before, branch_ref, prefix, out.events, out.saved_refs)
    try:
        git.reset("-q", "--mixed", base)
    except GitCommandError:
        # An index the agent broke beyond reading: rebuild it from the best commit.
        (Path(ws.repo.git_dir) / "index").unlink(missing_ok=True)
        git.reset("-q", "--mixed", base)


def _restore_refs(ws: Workspace, tag: str, before: RefSnapshot, branch_ref: str, prefix: str,
                  events: list[str], saved: list[str]) -> None:
    now = snapshot(ws, tag).refs
    for ref, sha in before.refs.items():
        if ref == branch_ref or now.get(ref) == sha:
            continue
        short = _label(ref)
        moved_to = now.get(ref)
        if moved_to is None:
            events.append(f"agent deleted {short} (restored)")
        else:
            if not ws.is_ancestor(moved_to, sha):
                _save(ws, prefix + "moved/" + ref.removeprefix("refs/"), moved_to, saved)
            events.append(f"agent moved {short} to {_short(moved_to)} (restored to {_short(sha)})")
        ws.repo.git.update_ref("-m", "autoloop: restored after the proposer", ref, sha)
    for ref in sorted(set(now) - set(before.refs) - {branch_ref}):
        if ref.startswith(_GUARDED) and not ref.startswith(ws.foreign_refs or ("\0",)):
            events.append(f"agent created {_label(ref)} (left in place)")


def _label(ref: str) -> str:
    for prefix, kind in (("refs/heads/", "branch"), ("refs/tags/", "tag")):
        if ref.startswith(prefix):
            return f"{kind} {ref.removeprefix(prefix)}"
    return ref

