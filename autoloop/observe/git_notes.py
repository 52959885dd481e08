"""The night readable in git itself: a git note on every trial commit.

Each commit the ledger names gets a note in ``refs/notes/autoloop`` holding one block per
attempt that ran it (a candidate and its confirmation re-run share a commit, so do the
baseline and its noise samples), in ledger order::

    #17 keep 1.0234 (-0.0041, 3.2σ) MATRIX_LR 0.04 -> 0.06
    metric: val_bpb 1.023400
    confidence: 3.2
    crash: -
    reason: beats the best by 0.0041 > 2.0 x noise 0.0012

so ``git log --notes=autoloop autoloop/<tag>`` tells the story of the kept commits, and
``git log --notes=autoloop refs/autoloop/<tag>/trials/17-1`` of a discarded one.

A commit's note is always rebuilt whole from the ledger (``git notes add -f`` with the
full text), so writing it again is harmless: :meth:`Notes.catch_up` compares every
commit's note with what the ledger says (by blob hash, computed here, one ``git notes
list`` for the lot) and rewrites only the ones that differ or are missing. That is how
notes follow recovery: an attempt recorded by ``--resume``, or one whose note a kill
prevented, gets its note at the next start.

Text from the ledger is untrusted (descriptions come from agents): each field is folded
onto one line with control characters removed, so a note always has its shape.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from autoloop.core.errors import AutoloopError
from autoloop.execution.procs import run_own_group
from autoloop.observe.console import format_verdict, plain
from autoloop.repo.workspace import FALLBACK_EMAIL, FALLBACK_NAME
from autoloop.store.ledger import LedgerRecord, trial_label
from autoloop.store.queries import best_before

NOTES_REF = "refs/notes/autoloop"


def _field(text: str | None) -> str:
    return plain(" ".join((text or "").split())) or "-"


def attempt_block(record: LedgerRecord, reference: float | None) -> str:
    """The lines of one attempt: its verdict line, then metric, confidence, crash, reason."""
    label = f"#{trial_label(record.trial, record.attempt)}"
    verdict = format_verdict(label, record.model_copy(update={"description": _field(record.description)}),
                             reference if record.status != "crash" else None)
    metric = "-" if record.metric is None else f"{record.metric:.6f}"
    confidence = "-" if record.confidence is None else f"{record.confidence:.1f}"
    lines = [_field(verdict),
             f"metric: {record.metric_name} {metric}",
             f"confidence: {confidence}",
             f"crash: {record.crash or '-'}",
             f"reason: {_field(record.reason)}"]
    if record.kind != "candidate":
        lines.append(f"kind: {record.kind}")
    if record.worker is not None:
        lines.append(f"worker: {record.worker}")
    return "\n".join(lines)


def notes_by_commit(records: list[LedgerRecord]) -> dict[str, str]:
    """commit sha -> the full text of its note, for every commit the ledger names."""
    blocks: dict[str, list[str]] = {}
    for record, reference in zip(records, best_before(records), strict=True):
        if record.commit and record.status != "skip" and record.kind != "verify":   # verify: report.md has them
            blocks.setdefault(record.commit, []).append(attempt_block(record, reference))
    return {sha: "\n\n".join(parts) + "\n" for sha, parts in blocks.items()}


def blob_sha(text: str) -> str:
    """The id git gives a blob holding ``text`` (what ``git hash-object`` prints)."""
    data = text.encode("utf-8")
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class NotesError(AutoloopError):
    """A note could not be written; the message is one line (the caller warns, never stops)."""


class Notes:
    """Writes the autoloop notes of one repository. Thread-safe (parallel workers share one)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._lock = threading.Lock()
        self._env: dict[str, str] | None = None

    def _identity(self) -> dict[str, str]:
        """The environment for git: a notes commit needs a committer, and a machine with no
        git identity must not lose its notes to "Please tell me who you are"."""
        if self._env is None:
            self._env = dict(os.environ)
            probe = run_own_group(["git", "var", "GIT_COMMITTER_IDENT"], cwd=self.root, env=self._env,
                                  capture_output=True)
            if probe.returncode != 0:
                self._env.update(GIT_AUTHOR_NAME=FALLBACK_NAME, GIT_COMMITTER_NAME=FALLBACK_NAME,
                                 GIT_AUTHOR_EMAIL=FALLBACK_EMAIL, GIT_COMMITTER_EMAIL=FALLBACK_EMAIL)
        return self._env

    def _git(self, *args: str, stdin: str = "") -> str:
        proc = run_own_group(["git", *args], cwd=self.root, env=self._identity(), input=stdin.encode("utf-8"),
                             capture_output=True)
        if proc.returncode != 0:
            lines = [line.strip() for line in proc.stderr.decode(errors="replace").splitlines() if line.strip()]
            why = lines[-1] if lines else f"exit code {proc.returncode}"
            raise NotesError(f"git {args[0]} failed: {why.removeprefix('fatal: ').removeprefix('error: ')}")
        out: bytes = proc.stdout
        return out.decode(errors="replace").strip()

    def existing(self) -> dict[str, str]:
        """commit -> blob id of its current autoloop note."""
        try:
            out = self._git("notes", "--ref", NOTES_REF, "list")
        except NotesError:
            return {}   # no notes ref yet
        pairs = (line.split() for line in out.splitlines() if line.strip())
        return {commit: blob for blob, commit in pairs}

    def write(self, commit: str, text: str) -> None:
        """Set the note of ``commit`` to exactly ``text`` (git's message clean-up is bypassed)."""
        with self._lock:
            blob = self._git("hash-object", "-w", "--stdin", stdin=text)
            self._git("notes", "--ref", NOTES_REF, "add", "-f", "-C", blob, commit)

    def record(self, records: list[LedgerRecord], record: LedgerRecord) -> None:
        """After ``record`` was appended to ``records`` (the whole ledger): its commit's note."""
        if not record.commit or record.status == "skip" or record.kind == "verify":
            return
        self.write(record.commit, notes_by_commit(records)[record.commit])

    def catch_up(self, records: list[LedgerRecord]) -> int:
        """Rewrite every note that differs from the ledger; returns how many were written."""
        have = self.existing()
        written = 0
        for commit, text in notes_by_commit(records).items():
            if have.get(commit) == blob_sha(text):
                continue
            try:
                self._git("cat-file", "-e", f"{commit}^{{commit}}")
            except NotesError:
                continue   # a commit the ledger names but this repository lost: nothing to annotate
            self.write(commit, text)
            written += 1
        return written
