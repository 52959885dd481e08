"""Git through GitPython: branch, clean-tree checks, commit, reset, scope check, trial refs.

Every git operation the orchestrator needs goes through `Workspace`, so the rest of the
harness never shells out to git. GitPython's porcelain is used where it is faithful to git;
elsewhere `repo.git.<command>` runs real git (status, add, commit, reset, clean),
because GitPython's own index writer ignores filters, hooks and some index extensions.
Every failure surfaces as a `WorkspaceError` whose message is one line for the user.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import git
from git.exc import BadName, GitCommandError, InvalidGitRepositoryError, NoSuchPathError
from git.objects import Commit

from autoloop.core.errors import AutoloopError
from autoloop.core.layout import RESULTS, branch_name, trial_ref, trial_ref_prefix
from autoloop.execution.gitsafe import is_git
from autoloop.execution.procs import OWN_GROUP, neutral_git, run_own_group, terminal_signal_held

# Used for candidate commits when the user has no git identity configured (a fresh
# machine, a container): git would refuse to commit, and the night would be lost.
FALLBACK_NAME = "autoloop"
FALLBACK_EMAIL = "autoloop@localhost"

# How many paths an error message names before it says "and N more".
_MAX_LISTED = 10


class WorkspaceError(AutoloopError):
    """The repository is not usable as a workspace; the message is one line for the user."""


def _git_error(err: GitCommandError) -> str:
    """The first meaningful line of a failed git command's stderr."""
    stderr = err.stderr if isinstance(err.stderr, str) else str(err.stderr or "")
    for line in stderr.splitlines():
        line = line.strip().strip("'").strip()
        if line.startswith("stderr:"):
            line = line[len("stderr:"):].strip().strip("'").strip()
        if line:
            return line.removeprefix("fatal: ").removeprefix("error: ")
    return f"git {' '.join(str(a) for a in err.command[1:2])} failed with exit code {err.status}"


def _listing(paths: list[str]) -> str:
    shown = ", ".join(paths[:_MAX_LISTED])
    more = len(paths) - _MAX_LISTED
    return f"{shown} and {more} more" if more > 0 else shown


class _OwnGroupGit(git.Git):
    """GitPython's git runner, every git process in a process group of its own.

    Every git it starts runs neutralised (`procs.neutral_git`): no hook, fsmonitor, external
    diff or filter of anyone else's runs inside it.

    GitPython keeps `git cat-file --batch` helpers alive between object lookups; in the
    terminal's foreground group a Ctrl-C killed them with the orchestrator's SIGINT, and the
    next lookup (judging the interrupted attempt) died of a BrokenPipeError; a short command
    started by a worker thread just as Ctrl-C landed died of it too (`terminal_signal_held`).
    """

    def execute(self, command: str | Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        for key, value in OWN_GROUP.items():
            kwargs.setdefault(key, value)
        with terminal_signal_held():
            if isinstance(command, (list, tuple)) and is_git(command):
                # Merged as GitPython merges them (it updates a copy of os.environ with this).
                base = {**os.environ, "LANGUAGE": "C", "LC_ALL": "C", **self._environment, **(kwargs.get("env") or {})}
                command, kwargs["env"] = neutral_git(list(command), base, self._working_dir)
            return super().execute(command, *args, **kwargs)


class Repository(git.Repo):
    """A GitPython repository whose git processes a terminal's Ctrl-C does not reach."""

    GitCommandWrapperType = _OwnGroupGit


class Workspace:
    """One experiment repository: the git work tree holding the target file.

    ``branch``: the branch this work tree works on when it is not the loop's own
    ``autoloop/<tag>`` (a parallel worker's worktree has a branch of its own).
    ``foreign_refs``: ref prefixes that other parts of the loop move while a proposer runs
    here (the loop's branch and every worker's); reconcile leaves them alone.
    """

    def __init__(self, path: Path, target: str = "train.py", results_dir: str | Path = RESULTS, *,
                 branch: str | None = None, foreign_refs: tuple[str, ...] = ()) -> None:
        self.branch = branch
        self.foreign_refs = foreign_refs
        path = Path(path).resolve()
        try:
            self.repo = Repository(path, search_parent_directories=True)
        except (InvalidGitRepositoryError, NoSuchPathError):
            raise WorkspaceError(
                f"not a git repository: {path} (run git init, or autoloop init DIR for a fresh experiment repo)"
            ) from None
        if self.repo.bare or self.repo.working_tree_dir is None:
            raise WorkspaceError(f"{path} is a bare git repository: autoloop needs a work tree (clone it first)")
        self.root = Path(self.repo.working_tree_dir).resolve()
        if not self.repo.head.is_valid():
            raise WorkspaceError(
                f"the repository at {self.root} has no commits yet (commit {target} and .gitignore first)"
            )
        # Targets are stored relative to the root with forward slashes, as git names paths.
        target_path = Path(target)
        if target_path.is_absolute():
            try:
                target_path = target_path.resolve().relative_to(self.root)
            except ValueError:
                raise WorkspaceError(f"target {target} is outside the repository {self.root}") from None
        self.target = target_path.as_posix()
        self.target_path = self.root / self.target
        results = Path(results_dir)
        self.results_dir = results if results.is_absolute() else self.root / results

    def close(self) -> None:
        """Stop GitPython's helper processes (long-lived cat-file)."""
        self.repo.close()

    # ---------------------------------------------------------------- checks

    def check_target(self) -> None:
        """The target exists in the work tree, a plain file of its own, and is committed in HEAD."""
        refused = self.target_refusal()
        if refused:
            raise WorkspaceError(refused)
        if not self.target_path.is_file():
            raise WorkspaceError(
                f"{self.target} not found in {self.root} (create it and commit it, or set the target in the config)"
            )
        try:
            self.repo.head.commit.tree / self.target
        except KeyError:
            raise WorkspaceError(
                f"{self.target} is not committed in {self.root} (git add {self.target} && git commit first)"
            ) from None

    def target_refusal(self) -> str | None:
        """Why the target cannot be what is measured, one line; None when it is a plain file.

        A symlink or a second hard link lets what is trained be changed through another
        path (outside the repository, unseen by the scope check); a folder is no program."""
        try:
            st = os.lstat(self.target_path)
        except OSError:
            return None   # missing: check_target and the proposal's screen say so
        if stat.S_ISLNK(st.st_mode):
            return f"{self.target} is a symbolic link (to {os.readlink(self.target_path)}): make it a plain file"
        if stat.S_ISDIR(st.st_mode):
            return f"{self.target} is a folder, not a file: put the training script there"
        if st.st_nlink > 1:
            return (f"{self.target} has {st.st_nlink - 1} other hard link(s): make it a file of its own "
                    f"(cp {self.target} x && mv x {self.target})")
        return None

    def detach_target(self, quarantine_dir: Path) -> str | None:
        """A linked or folder target (target_refusal) replaced by HEAD's plain file, what was
        there kept in quarantine_dir; returns why, or None when it was a plain file."""
        refused = self.target_refusal()
        if refused is None:
            return None
        dest = self._free_path(Path(quarantine_dir) / self.target)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(self.target_path), str(dest))   # a hard link moved: the other name keeps its inode
        try:
            self.repo.git.checkout("HEAD", "--", self.target)
        except GitCommandError as err:
            raise WorkspaceError(f"cannot restore {self.target}: {_git_error(err)}") from None
        return refused

    def _status(self) -> list[tuple[str, str, str | None]]:
        """(XY, path, original path of a rename/copy or None) for every non-clean path.

        `git status --porcelain -z` is the one format that is stable, unquoted and lists
        untracked files one by one (`-uall`) with ignored files left out.
        """
        out = self.repo.git.status("--porcelain=v1", "-z", "--untracked-files=all", strip_newline_in_stdout=False)
        fields = out.split("\0")
        entries: list[tuple[str, str, str | None]] = []
        i = 0
        while i < len(fields):
            field = fields[i]
            i += 1
            if len(field) < 4:
                continue
            xy, path = field[:2], field[3:]
            orig = None
            if xy[0] in "RC":  # a rename or copy: the next field is the source path
                orig = fields[i]
                i += 1
            entries.append((xy, path, orig))
        return entries

    def dirty_paths(self) -> list[str]:
        """Modified, staged, deleted and untracked (not ignored) paths, sorted."""
        paths: set[str] = set()
        for _, path, orig in self._status():
            paths.add(path)
            if orig:
                paths.add(orig)
        return sorted(paths)

    def ensure_clean(self) -> None:
        """Refuse a tree with uncommitted changes or untracked files, naming the commands that help.

        Untracked files are refused rather than worked around: every trial would run with
        them (an imported helper, a config) while no commit records them, so a kept change
        would not reproduce from its commit; and the scope check, which moves away whatever
        a proposer or a run creates, could not tell them from its own. Ignored files (data,
        logs) are outside all of this.
        """
        changed: list[str] = []
        untracked: list[str] = []
        for xy, path, orig in self._status():
            (untracked if xy == "??" else changed).append(path)
            if orig:
                changed.append(orig)
        changed, untracked = sorted(set(changed)), sorted(set(untracked))
        if changed and untracked:
            raise WorkspaceError(
                f"working tree has uncommitted changes: {_listing(changed)}; and untracked files: "
                f"{_listing(untracked)} (commit them, or set them aside with git stash -u; "
                "add outputs such as run.log to .gitignore)")
        if changed:
            raise WorkspaceError(f"working tree has uncommitted changes: {_listing(changed)} "
                                 "(commit them, or set them aside with git stash)")
        if untracked:
            raise WorkspaceError(
                f"working tree has untracked files: {_listing(untracked)} (trials would use them but no "
                "commit records them: set them aside with git stash -u, or add them to .gitignore "
                "if they are outputs such as run.log)")

    def ensure_results_ignored(self) -> None:
        """Resets must never touch the ledger: anything written under results/ must be ignored.

        A probe path inside the folder is checked rather than the folder itself, so that
        `results/*` with `!results/README.md` (a tracked readme, ignored content) passes.
        """
        try:
            rel = self.results_dir.resolve().relative_to(self.root)
        except ValueError:
            return  # outside the repository: git never sees it
        probe = (rel / "autoloop-ignore-probe").as_posix()
        try:
            self.repo.git.check_ignore("-q", probe)
        except GitCommandError as err:
            if err.status == 1:
                raise WorkspaceError(
                    f"{rel.as_posix()}/ is not git-ignored in {self.root} "
                    f"(add '{rel.as_posix()}/' to .gitignore and commit it)"
                ) from None
            raise WorkspaceError(f"git check-ignore failed: {_git_error(err)}") from None

    # -------------------------------------------------------------- branches

    def branch_name(self, tag: str) -> str:
        """The branch this work tree works on: its own, else the loop's autoloop/<tag>."""
        return self.branch or branch_name(tag)

    def current_branch(self) -> str | None:
        """The checked-out branch, None when HEAD is detached."""
        if self.repo.head.is_detached:
            return None
        return self.repo.active_branch.name

    def branch_exists(self, tag: str) -> bool:
        name = self.branch_name(tag)
        return any(head.name == name for head in self.repo.heads)

    def start_branch(self, tag: str, resume: bool, start: str | None = None) -> str:
        """Check out autoloop/<tag>: created at HEAD (or at ``start``, another branch: `run
        --from`) for a new run, existing for a resume. Returns the sha of HEAD afterwards."""
        name = self.branch_name(tag)
        try:
            self.repo.git.check_ref_format("--branch", name)
        except GitCommandError:
            raise WorkspaceError(f"invalid tag {tag!r}: {name} is not a valid git branch name") from None
        exists = self.branch_exists(tag)
        if resume and not exists:
            raise WorkspaceError(f"branch {name} does not exist: nothing to resume (drop --resume to start it)")
        if not resume and exists:
            raise WorkspaceError(f"branch {name} exists: pass --resume to continue it, or --tag NAME for a new one")
        try:
            if resume:
                self.repo.git.checkout("-q", name)
            elif start is not None:
                self.repo.git.checkout("-q", "-b", name, start)
            else:
                self.repo.git.checkout("-q", "-b", name)
        except GitCommandError as err:
            raise WorkspaceError(f"cannot check out {name}: {_git_error(err)}") from None
        return self.head()

    # ------------------------------------------------------------- commits

    def head(self) -> str:
        return self.repo.head.commit.hexsha

    def _resolve(self, rev: str) -> str:
        return self._commit(rev).hexsha

    def _commit(self, rev: str) -> Commit:
        try:
            return self.repo.commit(rev)
        except (ValueError, BadName, GitCommandError):
            raise WorkspaceError(f"unknown commit {rev!r} in {self.root}") from None

    def undo_run_writes(self, quarantine_dir: Path) -> list[str]:
        """After a run: put back whatever the trial wrote into the repository (a notes file, a
        checkpoint beside train.py, train.py itself), each changed version kept in
        quarantine_dir; returns the sorted paths. The candidate is the commit that ran: what
        the run wrote is not part of it, and left in place it would dirty a kept commit's
        tree or be taken for the next proposal's edit."""
        touched = self.revert_out_of_scope(quarantine_dir)
        if self.detach_target(quarantine_dir):
            touched = sorted({*touched, self.target})
        if self.target_changed():
            src = self.target_path
            if src.is_file():
                self._quarantine_copy(src, Path(quarantine_dir) / self.target)
            try:
                self.repo.git.checkout("HEAD", "--", self.target)
            except GitCommandError as err:
                raise WorkspaceError(f"cannot restore {self.target}: {_git_error(err)}") from None
            touched = sorted({*touched, self.target})
        return touched

    def target_changed(self) -> bool:
        """The target differs from HEAD in the work tree or in the index (deletion counts)."""
        for args in (("HEAD",), ("--cached", "HEAD")):
            try:
                self.repo.git.diff("--quiet", *args, "--", self.target)
            except GitCommandError as err:
                if err.status == 1:
                    return True
                raise WorkspaceError(f"git diff failed: {_git_error(err)}") from None
        return False

    def _identity_env(self) -> dict[str, str]:
        """Author/committer variables for what the user has not configured, so a commit
        never fails on "Please tell me who you are". Configured values and GIT_* variables
        already in the environment win."""
        env: dict[str, str] = {}
        for key, fallback, variables in (
            ("user.name", FALLBACK_NAME, ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME")),
            ("user.email", FALLBACK_EMAIL, ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL")),
        ):
            try:
                if self.repo.git.config("--get", key).strip():
                    continue
            except GitCommandError:
                pass  # exit 1: not set anywhere
            for var in variables:
                if not os.environ.get(var):
                    env[var] = fallback
        return env

    def commit_candidate(self, message: str) -> str:
        """Commit the target alone with `message`; returns the new sha.

        `git commit --only -- target` takes the target from the work tree and leaves any
        other staged change out of the commit. Hooks are skipped (--no-verify) and signing
        is off: an overnight loop cannot answer a passphrase prompt, and a formatter hook
        rewriting the target would change what was proposed.
        """
        if not self.target_changed():
            raise WorkspaceError(f"{self.target} has no change to commit")
        message = message.strip() or "autoloop candidate"
        try:
            # Stage first so that a target the proposer deleted, or unstaged with
            # `git rm --cached`, is still a path the --only commit can name.
            if self.target_path.exists():
                self.repo.git.add("--", self.target)
            else:
                self.repo.git.rm("-q", "--cached", "--ignore-unmatch", "--", self.target)
            with self.repo.git.custom_environment(**self._identity_env()):
                self.repo.git.commit(
                    "-q", "--no-verify", "--no-gpg-sign", "--only", "-m", message, "--", self.target
                )
        except GitCommandError as err:
            raise WorkspaceError(f"cannot commit {self.target}: {_git_error(err)}") from None
        return self.head()

    def commit_text_on(self, base: str, text: str, message: str) -> str:
        """A commit whose tree is ``base``'s with the target's text replaced, its parent
        ``base``; returns its sha. Plumbing on a private index: the work tree, the index,
        HEAD and every branch stay as they are (verification builds its variants so)."""
        base = self._resolve(base)
        listed = self.repo.git.ls_tree(base, "--", self.target).split()
        mode = listed[0] if listed else "100644"
        with tempfile.TemporaryDirectory(prefix="autoloop-index-") as tmp:
            blob_file = Path(tmp) / "target"
            blob_file.write_text(text)
            env = {**self._identity_env(), "GIT_INDEX_FILE": str(Path(tmp) / "index")}
            try:
                with self.repo.git.custom_environment(**env):
                    blob = self.repo.git.hash_object("-w", "--", str(blob_file)).strip()
                    self.repo.git.read_tree(base)
                    self.repo.git.update_index("--add", "--cacheinfo", f"{mode},{blob},{self.target}")
                    tree = self.repo.git.write_tree().strip()
                    return str(self.repo.git.commit_tree(tree, "-p", base, "-m", message)).strip()
            except GitCommandError as err:
                raise WorkspaceError(f"cannot make a commit on {base[:12]}: {_git_error(err)}") from None

    # ---------------------------------------------------------- trial refs

    def save_trial_ref(self, tag: str, trial: int, attempt: int, sha: str) -> str:
        """Keep a discarded or crashed candidate reachable (and safe from gc) after a reset.

        The name is `<trial>-<attempt>`: git cannot hold both trials/5 and trials/5/2.
        """
        return self.save_ref(trial_ref(tag, trial, attempt), sha, f"autoloop trial {trial}-{attempt}")

    def save_ref(self, ref: str, sha: str, why: str) -> str:
        """Point ``ref`` at ``sha`` (kept reachable, safe from gc); ``why`` goes in the reflog."""
        full = self._resolve(sha)
        try:
            self.repo.git.update_ref("-m", why, ref, full)
        except GitCommandError as err:
            raise WorkspaceError(f"cannot write {ref}: {_git_error(err)}") from None
        return ref

    def trial_refs(self, tag: str) -> dict[str, str]:
        """Every saved trial ref of the tag: full ref name -> sha."""
        out = self.repo.git.for_each_ref("--format=%(refname) %(objectname)", trial_ref_prefix(tag))
        refs: dict[str, str] = {}
        for line in out.splitlines():
            name, _, sha = line.partition(" ")
            if name:
                refs[name] = sha
        return refs

    # -------------------------------------------------------------- resets

    def reset_to(self, sha: str) -> None:
        """`git reset --hard sha` on the current branch, then delete untracked files that
        are not ignored. Ignored paths (results/, caches) are never touched."""
        full = self._resolve(sha)
        try:
            self.repo.git.reset("-q", "--hard", full)
            # Again until nothing is removed: deleting an untracked .gitignore can reveal
            # files it was hiding.
            for _ in range(5):
                if not self.repo.git.clean("-f", "-d").strip():
                    break
        except GitCommandError as err:
            raise WorkspaceError(f"cannot reset to {full[:12]}: {_git_error(err)}") from None

    def revert_out_of_scope(self, quarantine_dir: Path, base: str | None = None) -> list[str]:
        """Undo every change except the target's edit; returns the sorted paths touched.

        - tracked files modified, deleted or staged: restored from HEAD (index and work tree);
          a modified file's work-tree content is first copied into quarantine_dir
        - files added to the index or untracked (not ignored): moved into quarantine_dir,
          keeping their relative paths
        Nothing the proposer wrote is lost; ignored files are left alone.

        `base`: the commit HEAD was at before the proposer ran. Agents that commit on their
        own (Aider does by default) move HEAD; a soft reset to base turns their commits
        back into staged changes, which are then guarded like any other change.
        """
        quarantine_dir = Path(quarantine_dir)
        if base is not None:
            full = self._resolve(base)
            if self.head() != full:
                try:
                    self.repo.git.reset("-q", "--soft", full)
                except GitCommandError as err:
                    raise WorkspaceError(f"cannot undo the proposer's commits: {_git_error(err)}") from None

        # First put tracked files back, .gitignore files included, so that the untracked
        # scan below sees HEAD's ignore rules: an agent that un-ignored results/ must not
        # get the ledger quarantined, and one that ignored its own files must not hide them.
        head_tree = self.repo.head.commit.tree
        restore: set[str] = set()  # in HEAD: index and work tree from HEAD
        unstage: set[str] = set()  # in the index but not in HEAD: drop from the index
        for xy, path, orig in self._status():
            for p in (path, orig):
                if p is None or p == self.target or xy == "??":
                    continue
                try:
                    head_tree / p
                    restore.add(p)
                except KeyError:
                    unstage.add(p)
        try:
            # Save the proposer's version of modified files before HEAD's overwrites them.
            for p in sorted(restore):
                src = self.root / p
                if src.is_file() or src.is_symlink():
                    self._quarantine_copy(src, quarantine_dir / p)
            if unstage:
                self.repo.git.rm("-q", "--cached", "-r", "--ignore-unmatch", "--", *sorted(unstage))
            if restore:
                # `checkout HEAD -- paths` sets index and work tree from HEAD, deleted files too.
                self.repo.git.checkout("-q", "HEAD", "--", *sorted(restore))
        except GitCommandError as err:
            raise WorkspaceError(f"scope check could not restore files: {_git_error(err)}") from None

        # Then move untracked files away.
        return sorted(restore | unstage | set(self.set_aside_untracked(quarantine_dir)))

    def set_aside_untracked(self, dest_dir: Path) -> list[str]:
        """Move every untracked (not ignored) file but the target into dest_dir, keeping its
        relative path; returns the sorted paths. Repeated: moving an untracked .gitignore can
        reveal files it was hiding (bounded, in case something keeps reappearing)."""
        moved: set[str] = set()
        for _ in range(5):
            untracked = [p.rstrip("/") for xy, p, _ in self._status() if xy == "??" and p != self.target]
            if not untracked:
                break
            for p in untracked:
                src = self.root / p
                if not (src.exists() or src.is_symlink()):
                    continue
                dest = self._free_path(Path(dest_dir) / p)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(src), str(dest))  # a nested repository moves as a whole folder
                self._prune_empty_dirs(src.parent)
                moved.add(p)
        return sorted(moved)

    @staticmethod
    def _free_path(dest: Path) -> Path:
        """dest, or dest.1, dest.2, ... if something is already there (never overwrite)."""
        candidate, n = dest, 0
        while candidate.exists() or candidate.is_symlink():
            n += 1
            candidate = dest.with_name(f"{dest.name}.{n}")
        return candidate

    def _quarantine_copy(self, src: Path, dest: Path) -> None:
        dest = self._free_path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest, follow_symlinks=False)

    def _prune_empty_dirs(self, directory: Path) -> None:
        """Remove directories the moved files leave empty, up to the repository root."""
        while directory != self.root and self.root in directory.parents:
            try:
                directory.rmdir()
            except OSError:
                return  # not empty (or gone): stop
            directory = directory.parent

    # ------------------------------------------------------------- reading

    def diff_lines(self, a: str, b: str) -> int:
        """Lines added plus lines removed in the target between commits a and b."""
        try:
            out = self.repo.git.diff("--numstat", self._resolve(a), self._resolve(b), "--", self.target)
        except GitCommandError as err:
            raise WorkspaceError(f"git diff failed: {_git_error(err)}") from None
        total = 0
        for line in out.splitlines():
            added, removed, _ = line.split("\t", 2)
            # A binary file shows "-": it has no line count.
            total += (int(added) if added.isdigit() else 0) + (int(removed) if removed.isdigit() else 0)
        return total

    def diff_text(self, a: str | None = None) -> str:
        """Unified diff of the target, work tree against commit a (default HEAD)."""
        rev = self._resolve(a) if a is not None else "HEAD"
        try:
            return str(self.repo.git.diff(rev, "--", self.target, strip_newline_in_stdout=False))
        except GitCommandError as err:
            raise WorkspaceError(f"git diff failed: {_git_error(err)}") from None

    def is_ancestor(self, a: str, b: str) -> bool:
        """Whether a is an ancestor of b (a commit is its own ancestor); False when either is unknown."""
        try:
            return self.repo.is_ancestor(self._commit(a), self._commit(b))
        except (WorkspaceError, GitCommandError):
            return False

    def commit_message(self, sha: str) -> str:
        message = self.repo.commit(self._resolve(sha)).message
        return (message.decode("utf-8", "replace") if isinstance(message, bytes) else message).rstrip("\n")

    def file_at(self, sha: str, path: str) -> str | None:
        """The text of path at commit sha; None when the path is not a file there."""
        tree = self.repo.commit(self._resolve(sha)).tree
        try:
            blob = tree / Path(path).as_posix()
        except KeyError:
            return None
        if blob.type != "blob":
            return None
        data: bytes = blob.data_stream.read()
        return data.decode("utf-8", errors="replace")

    def merge_change(self, base: str, ours: str, theirs: str) -> str | None:
        """The target of `theirs` (a change built on `base`) replayed onto `ours`: a 3-way
        merge of the target alone; None on a conflict or when a side has no target."""
        found = [self.file_at(sha, self.target) for sha in (ours, base, theirs)]
        texts = [t for t in found if t is not None]
        if len(texts) < len(found):
            return None
        with tempfile.TemporaryDirectory(prefix="autoloop-merge-") as tmp:
            paths = []
            for name, text in zip(("ours", "base", "theirs"), texts, strict=True):
                path = Path(tmp) / name
                path.write_text(text)
                paths.append(str(path))
            # Exit code: the number of conflicts (0: clean), negative (255) on an error.
            out = run_own_group(["git", "merge-file", "-p", *paths], capture_output=True, text=True)
        return out.stdout if out.returncode == 0 else None
