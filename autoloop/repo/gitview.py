"""Read-only git views of what the ledger names: an attempt's diff, a file at a commit.

Used by the dashboard, ``report --since-last`` and the trackers. Revisions come from ledger
records only and must look like object ids (hex); they are passed after ``--end-of-options``
so no text could ever be read as an option. Nothing here writes to the repository, and
each call is its own ``git`` process, so it is safe from any thread while a loop runs.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from autoloop.execution.procs import run_own_group
from autoloop.store.ledger import LedgerRecord

_SHA = re.compile(r"^[0-9a-f]{7,64}$")
MAX_DIFF_BYTES = 2 * 2**20    # a diff beyond this is cut (a generated file, a vendored blob)


def is_sha(text: str | None) -> bool:
    return text is not None and bool(_SHA.match(text))


def _git(root: Path, *args: str) -> bytes | None:
    try:
        proc = run_own_group(["git", *args], cwd=root, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def commit_diff(root: Path, parent: str, commit: str, limit: int = MAX_DIFF_BYTES) -> str | None:
    """``git diff parent commit`` as text (cut at ``limit`` bytes with a line saying so);
    None when either is not a commit id of this repository."""
    if not (is_sha(parent) and is_sha(commit)):
        return None
    out = _git(root, "diff", "--no-color", "--no-ext-diff", "--end-of-options", f"{parent}^{{commit}}",
               f"{commit}^{{commit}}")
    if out is None:
        return None
    text = out[:limit].decode("utf-8", errors="replace")
    if len(out) > limit:
        text += f"\n[autoloop: diff cut at {limit} of {len(out)} bytes]\n"
    return text


def record_diff(root: Path, record: LedgerRecord) -> str | None:
    """An attempt's change against the best it was built on; "" when it changed nothing
    (the baseline, a noise sample, a confirmation re-run), None when git cannot tell."""
    if not record.commit or not record.parent:
        return None
    if record.commit == record.parent:
        return ""
    return commit_diff(root, record.parent, record.commit)


def file_at(root: Path, commit: str, path: str) -> str | None:
    """The text of ``path`` at ``commit``; None when absent or not a commit id."""
    if not is_sha(commit):
        return None
    out = _git(root, "show", "--no-color", "--end-of-options", f"{commit}:{path}")
    return None if out is None else out.decode("utf-8", errors="replace")


def branch_names(root: Path) -> set[str] | None:
    """The repository's local branch names (``autoloop history``: is a night's final branch
    still there); None when git cannot say."""
    out = _git(root, "for-each-ref", "--format=%(refname:short)", "refs/heads/")
    return None if out is None else {line for line in out.decode("utf-8", "replace").splitlines() if line}
