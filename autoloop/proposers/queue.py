"""A queue of ready-made changes: patch files and whole-file replacements, applied in name order.

Put `001_raise_lr.patch`, `002_wider.diff` or `003_rewrite.py` in the queue folder; each
trial takes the first by file name. A `.patch`/`.diff` is a unified diff of the target
(`git diff`, `git format-patch`, `diff -u`; with or without a/ b/ prefixes), applied with
`git apply`. A `.py` file replaces the target whole. The file is moved to `done/` before the
change is made, so a restart never proposes it twice, even if the change then crashed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from autoloop.execution.procs import run_own_group
from autoloop.proposers.base import Proposal, ProposalFailed, ProposalRequest

PATCH_SUFFIXES = (".patch", ".diff")
REPLACEMENT_SUFFIXES = (".py",)
DONE_DIR = "done"

# Where the diff proper starts; free text before it is the description.
_DIFF_START = ("diff ", "--- ", "+++ ", "Index: ", "@@ ")
# "[PATCH]", "[PATCH 2/5]", "[RFC PATCH v2]" in a format-patch subject.
_PATCH_TAG = re.compile(r"^\s*\[[^\]]*\]\s*")
_PY_HEADER = re.compile(r"^#\s*autoloop:\s*(.*\S)\s*$")


def description_from_name(name: str) -> str:
    """'003_raise_lr.patch' -> 'raise lr'; a name of digits alone stays as it is."""
    stem = Path(name).stem
    text = re.sub(r"[_-]+", " ", stem.lstrip("0123456789_-")).strip()
    return text or stem


def description_from_patch(text: str) -> str | None:
    """The Subject of a format-patch mail, else the first line of free text before the diff."""
    lines = text.splitlines()
    header: list[str] = []
    for line in lines:
        if line.startswith(_DIFF_START) or line.rstrip() == "---":
            break
        header.append(line)
    for i, line in enumerate(header):
        if line.startswith("Subject:"):
            # RFC 2822 folding: continuation lines start with whitespace.
            parts = [line[len("Subject:"):]]
            for cont in header[i + 1:]:
                if not cont[:1].isspace() or not cont.strip():
                    break
                parts.append(cont)
            subject = _PATCH_TAG.sub("", " ".join(p.strip() for p in parts)).strip()
            if subject:
                return subject
    for line in header:
        # Mail headers of a format-patch file are not a description.
        if re.match(r"^(From |From:|Date:|Subject:|Message-Id:|MIME-|Content-)", line, re.IGNORECASE):
            continue
        text_line = line.strip().lstrip("#").strip()
        if text_line:
            return text_line
    return None


def description_from_replacement(text: str) -> str | None:
    """A `# autoloop: <description>` comment on the first line (after a shebang, if any)."""
    lines = text.splitlines()[:2]
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    if lines:
        match = _PY_HEADER.match(lines[0])
        if match:
            return match.group(1)
    return None


def _first_error_line(stderr: str) -> str:
    for line in stderr.splitlines():
        line = line.strip()
        if line:
            return line.removeprefix("error: ")
    return "git apply failed"


class QueueProposer:
    """Proposes the queued changes one by one; None once the queue is empty."""

    name = "queue"
    can_fix = False

    def __init__(self, queue_dir: Path) -> None:
        self.queue_dir = Path(queue_dir)

    def pending(self) -> list[Path]:
        """Queued files in the order they will be proposed."""
        if not self.queue_dir.is_dir():
            return []
        suffixes = PATCH_SUFFIXES + REPLACEMENT_SUFFIXES
        return sorted(
            (p for p in self.queue_dir.iterdir()
             if p.is_file() and p.suffix in suffixes and not p.name.startswith(".")),
            key=lambda p: p.name,
        )

    def propose(self, request: ProposalRequest) -> Proposal | None:
        if request.fix is not None:
            return None  # a queued change cannot be repaired: the loop moves on
        for queued in self.pending():
            path = self._consume(queued)
            if path is not None:
                break
        else:
            return None
        name = queued.name
        target = Path(request.workspace) / request.target
        data = path.read_bytes()
        text = data.decode("utf-8", errors="replace")

        if path.suffix in REPLACEMENT_SUFFIXES:
            if not data.strip():
                raise ProposalFailed(f"replacement {name} is empty")
            target.write_bytes(data)
            description = description_from_replacement(text)
        else:
            self._apply(path, name, Path(request.workspace))
            description = description_from_patch(text)
        return Proposal(description=description or description_from_name(name), source=name)

    def _consume(self, path: Path) -> Path | None:
        """Claim the file by moving it into done/ (never overwriting an earlier one of the
        same name); None when another worker claimed it first. The claim is one rename:
        of two workers taking the same file, exactly one succeeds."""
        done = self.queue_dir / DONE_DIR
        done.mkdir(exist_ok=True)
        dest, n = done / path.name, 0
        while dest.exists():
            n += 1
            dest = done / f"{path.stem}.{n}{path.suffix}"
        try:
            os.rename(path, dest)   # atomic: the worker whose rename finds the file gone lost it
        except FileNotFoundError:
            return None
        return dest

    @staticmethod
    def _apply(patch: Path, name: str, workspace: Path) -> None:
        """`git apply`, then `-p0` for a diff without a/ b/ prefixes (`git diff --no-prefix`).

        Plain `git apply` already guesses the strip level of a traditional `diff -u`.
        git apply is all-or-nothing, so a failed try leaves the work tree untouched.
        """
        errors: list[str] = []
        for extra in ([], ["-p0"]):
            result = run_own_group(
                ["git", "apply", "--whitespace=nowarn", *extra, str(patch.resolve())],
                cwd=workspace, capture_output=True, text=True,
            )
            if result.returncode == 0:
                return
            errors.append(_first_error_line(result.stderr))
        # Report the try that matches the patch's style: -p1 for git-style a/ b/ names.
        text = patch.read_text(errors="replace")
        prefixed = re.search(r"^(diff --git a/|--- a/|\+\+\+ b/)", text, re.MULTILINE) is not None
        reason = errors[0] if prefixed or len(errors) < 2 else errors[1]
        raise ProposalFailed(f"patch {name} does not apply: {reason}")
