"""Git plumbing on an index file of its own: trees read and written, entries set, commits
made and a branch created, while HEAD, the repository's index, the work tree and every
existing branch stay as they are (``autoloop finalize`` builds its branch this way, safe
while a loop runs).

The index is a private file (``GIT_INDEX_FILE``) every command of a :class:`PrivateIndex`
runs with; its git processes are the workspace's (``workspace.Repository``: out of the
terminal's group, neutralised). Every failure is a :class:`PlumbingError` whose message is
one line for the user (``git <command> failed: <why>``).
"""

from __future__ import annotations

from pathlib import Path

import git
from git.exc import GitCommandError

from autoloop.core.errors import AutoloopError
from autoloop.repo.workspace import FALLBACK_EMAIL, FALLBACK_NAME, Repository


class PlumbingError(AutoloopError):
    """A git command on the private index failed; the message is one line for the user."""


class PrivateIndex:
    """The few git commands finalize needs, with a private index file."""

    def __init__(self, root: Path, index: Path):
        try:
            self.repo = Repository(root, search_parent_directories=True)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise PlumbingError(f"not a git repository: {root}") from None
        self.index_env = {"GIT_INDEX_FILE": str(index)}

    def _run(self, *args: str, env: dict[str, str] | None = None, strip: bool = True) -> str:
        try:
            return str(self.repo.git.execute(["git", *args], env={**self.index_env, **(env or {})},
                                             strip_newline_in_stdout=strip))
        except GitCommandError as err:
            lines = [line.strip() for line in str(err.stderr or "").splitlines() if line.strip()]
            why = lines[-1].removeprefix("stderr:").strip().strip("'").strip() if lines else f"exit code {err.status}"
            why = why.removeprefix("fatal: ").removeprefix("error: ")
            raise PlumbingError(f"git {args[0]} failed: {why}") from None

    # ---------------------------------------------------------------- reading

    def resolve(self, rev: str) -> str | None:
        try:
            return str(self.repo.git.rev_parse("--verify", "--quiet", f"{rev}^{{commit}}"))
        except GitCommandError:
            return None

    def head_branch(self) -> str:
        """The checked-out branch's full ref name; "" on a detached HEAD."""
        return self.repo.head.reference.name if not self.repo.head.is_detached else ""

    def valid_branch_name(self, branch: str) -> bool:
        try:
            self.repo.git.check_ref_format("--branch", branch)
        except GitCommandError:
            return False
        return True

    def entry(self, path: str) -> tuple[str, str] | None:
        """(mode, blob) of path in the private index, None when absent."""
        out = self._run("ls-files", "-s", "-z", "--", path, strip=False)
        for item in out.split("\0"):
            meta, _, name = item.partition("\t")
            if name == path:
                mode, blob, _stage = meta.split()
                return mode, blob
        return None

    def changes(self, parent: str, commit: str) -> list[tuple[str, str, str, str, str, str]]:
        """(old mode, new mode, old blob, new blob, status, path) of each path changed."""
        out = self._run("diff-tree", "-r", "-z", "--no-renames", "--no-commit-id", parent, commit, strip=False)
        parts = out.split("\0")
        entries = []
        for i in range(0, len(parts) - 1, 2):
            meta, path = parts[i], parts[i + 1]
            if not meta.startswith(":"):
                continue
            old_mode, new_mode, old_blob, new_blob, status = meta[1:].split()
            entries.append((old_mode, new_mode, old_blob, new_blob, status[0], path))
        return entries

    def changed_paths(self, a: str, b: str) -> list[str]:
        """The paths whose content differs between two commits' trees."""
        out = self._run("diff-tree", "-r", "--name-only", "-z", "--no-commit-id", a, b, strip=False)
        return [p for p in out.split("\0") if p]

    def patch(self, parent: str, commit: str, path: str) -> str:
        """The change of one path from parent to commit, as a binary-safe patch."""
        return self._run("diff", "--binary", "--full-index", parent, commit, "--", path, strip=False)

    def blob_text(self, blob: str) -> str | None:
        """A blob (or rev:path) as text; None when it is not UTF-8 text."""
        data = self.repo.git.cat_file("blob", blob, stdout_as_string=False, strip_newline_in_stdout=False)
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            return None
        return None if "\0" in text else text

    def text(self, rev: str, path: str) -> str:
        try:
            return str(self.repo.git.show(f"{rev}:{path}", strip_newline_in_stdout=False))
        except GitCommandError:
            return ""   # absent at rev (an added or deleted file)

    def ident_env(self, sha: str | None) -> dict[str, str]:
        """Author of the original commit; committer: the user, or that author when git has
        no identity configured (a commit must never fail on 'Please tell me who you are').
        Without a commit (the results commit): the user, else autoloop's fallback identity."""
        if sha is None:
            name, email, env = FALLBACK_NAME, FALLBACK_EMAIL, {}
        else:
            name, email, date = self.repo.git.log("-1", "--format=%an%x00%ae%x00%ad", "--date=raw", sha).split("\0")
            env = {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": date}
        try:
            self.repo.git.var("GIT_COMMITTER_IDENT")
        except GitCommandError:
            env.update(GIT_COMMITTER_NAME=name, GIT_COMMITTER_EMAIL=email)
            if sha is None:
                env.update(GIT_AUTHOR_NAME=name, GIT_AUTHOR_EMAIL=email)
        return env

    # ---------------------------------------------------------------- writing

    def read_tree(self, rev: str) -> None:
        """The private index set to the tree of ``rev``."""
        self._run("read-tree", f"{rev}^{{tree}}")

    def write_blob(self, file: Path) -> str:
        """A file's bytes stored as a blob (no filter, no .gitignore); its sha."""
        return self._run("hash-object", "-w", "--", str(file))

    def set_entry(self, mode: str, blob: str, path: str) -> None:
        self._run("update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}")

    def remove_entry(self, path: str) -> None:
        self._run("update-index", "--force-remove", "--", path)

    def apply_cached(self, patch: Path) -> None:
        """A patch file applied to the private index (``git apply --cached``)."""
        self._run("apply", "--cached", str(patch))

    def write_tree(self) -> str:
        return self._run("write-tree")

    def commit_tree(self, tree: str, parent: str, message: str, env: dict[str, str]) -> str:
        """A commit of ``tree`` on ``parent`` (nothing points at it yet); its sha."""
        return self._run("commit-tree", tree, "-p", parent, "-m", message, env=env)

    def create_ref(self, ref: str, sha: str, reason: str) -> None:
        """``ref`` made to point at ``sha`` only if it does not exist yet (old value: none)."""
        self._run("update-ref", "-m", reason, ref, sha, "0" * len(sha))
