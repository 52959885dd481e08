"""What another program may ask of a night from outside it (autoloop mcp --allow-write): a
patch for the queue, checked first; a stop after the running trial. Each refusal is one
line saying why. Nothing here touches the work tree or git: a night may be running."""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from autoloop.config.loading import load_settings
from autoloop.core.errors import AutoloopError
from autoloop.core.layout import Layout
from autoloop.execution.procs import run_own_group
from autoloop.proposers.queue import QueueProposer, description_from_patch
from autoloop.repo.gitview import file_at
from autoloop.store import queries
from autoloop.store.ledger import Ledger
from autoloop.store.stop_request import request_stop

MAX_PATCH_BYTES = 256 * 1024
# Lines of a git diff that do more than change the target's lines.
_NOT_AN_EDIT = re.compile(r"^(new file mode|deleted file mode|rename from|rename to|copy from|copy to|"
                          r"old mode|new mode|GIT binary patch|Binary files)", re.MULTILINE)
_NAMES = re.compile(r"^(?:--- |\+\+\+ )(\S+)|^diff --git (\S+) (\S+)", re.MULTILINE)


class Refused(AutoloopError):
    """A write the caller asked for that autoloop will not do; the message says why."""


def _paths(diff: str) -> set[str]:
    found = set()
    for match in _NAMES.finditer(diff):
        for name in (n for n in match.groups() if n):
            if name == "/dev/null":
                raise Refused("the patch creates or deletes a file: only edits of the target are queued")
            found.add(name[2:] if name[:2] in ("a/", "b/") else name)
    return found


def check_patch(diff: str, target: str) -> None:
    """Refuse a diff that is not a plain edit of ``target`` alone."""
    if not diff.strip():
        raise Refused("an empty patch")
    if len(diff.encode()) > MAX_PATCH_BYTES:
        raise Refused(f"the patch is over {MAX_PATCH_BYTES // 1024} KiB")
    if "\0" in diff:
        raise Refused("the patch holds a NUL byte: only text edits of the target are queued")
    found = _NOT_AN_EDIT.search(diff)
    if found:
        raise Refused(f"the patch does more than edit lines ({found.group(1)}): only edits of {target} are queued")
    paths = _paths(diff)
    if not paths or "\n@@ " not in "\n" + diff:
        raise Refused("not a unified diff: no ---/+++ file names or no @@ hunk")
    others = sorted(paths - {target})
    if others:
        raise Refused(f"the patch touches {', '.join(others)}: only {target} may change")


def _applies(diff: str, target: str, text: str) -> None:
    """``git apply --check`` of the diff on ``text`` as ``target``, in a folder of its own."""
    with tempfile.TemporaryDirectory(prefix="autoloop-patch-") as tmp:
        path = Path(tmp) / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        patch = Path(tmp) / ".patch"
        patch.write_text(diff)
        errors = []
        for extra in ([], ["-p0"]):   # as the queue applies it: a/ b/ names, then none
            proc = run_own_group(["git", "apply", "--check", "--whitespace=nowarn", *extra, str(patch)],
                                 cwd=tmp, capture_output=True, text=True)
            if proc.returncode == 0:
                return
            errors.append(next((ln.removeprefix("error: ") for ln in proc.stderr.splitlines() if ln.strip()),
                               "git apply failed"))
    raise Refused(f"the patch does not apply to the best: {errors[0]}")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:40] or "patch"


def queue_patch(root: Path, diff: str, description: str | None = None) -> dict[str, Any]:
    """Check ``diff`` against the best and put it at the end of the queue; what was queued."""
    settings = load_settings(root)
    target = settings.target
    check_patch(diff, target)
    layout = Layout.of(root)
    records = Ledger(layout.root).records() if layout.ledger.exists() else []
    best = queries.best(records)[0]
    if best is None:
        head = run_own_group(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
        best = head.stdout.strip() if head.returncode == 0 else None
    text = None if best is None else file_at(root, best, target)
    if text is None:
        raise Refused(f"no best commit with {target} to check the patch against")
    _applies(diff, target, text)
    line = " ".join((description or description_from_patch(diff) or "").split())[:300]
    queue = Path(settings.queue_dir)
    queue = queue if queue.is_absolute() else root / queue
    queue.mkdir(parents=True, exist_ok=True)
    # 'q' sorts after the numbered names a person gives, so the patch runs after those waiting.
    name = f"q{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid() % 1000:03d}_{_slug(line)}.patch"
    tmp = queue / f".{name}.tmp"
    body = diff if diff.endswith("\n") else diff + "\n"
    tmp.write_text((f"{line}\n\n" if line else "") + body)
    os.replace(tmp, queue / name)   # the queue sees the whole file or nothing
    waiting = [p.name for p in QueueProposer(queue).pending()]
    return {"queued": name, "best": best, "description": line or None, "position": waiting.index(name) + 1,
            "waiting": len(waiting),
            "note": "the queue proposer (--proposer queue, or a portfolio with queue) takes it at a coming trial"}


def stop_after_trial(root: Path, running: bool, pid: int | None) -> dict[str, Any]:
    """Ask the running night to start no new trial; the ones running finish and are recorded."""
    if not running or pid is None:
        raise Refused("no night is running here: nothing to stop")
    path = request_stop(Layout.of(root).root, pid)
    return {"requested": True, "pid": pid, "file": str(path.relative_to(root))}
