"""An internal error (a bug of ours, not a mistake of the user's) written down whole.

The one line on stderr keeps the terminal readable; the traceback and the versions go to a
log file that line names, under the repository's results/ (git-ignored, where the user
looks after a night) or, when there is none, the system's temporary folder. A bug report
with that file attached carries what a fix needs without asking the user to reproduce it.
"""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

from autoloop import __version__
from autoloop.cli.paths import repo_root
from autoloop.core.layout import Layout


def write_log(error: BaseException, argv: list[str], directory: str) -> Path | None:
    """The log of ``error`` in the first folder that takes it; None when none does."""
    text = _report(error, argv)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for folder in _folders(directory):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return _write_new(folder, f"internal-error-{stamp}", text)
        except OSError:
            continue
    return None


def _folders(directory: str) -> Iterator[Path]:
    """results/ of the repository when it has one or is a git repository (then results/ is
    what autoloop makes anyway), else the temporary folder."""
    root = repo_root(directory)
    results = Layout.of(root).root
    if results.is_dir() or (root / ".git").exists():
        yield results
    yield Path(tempfile.gettempdir())


def _write_new(folder: Path, stem: str, text: str) -> Path:
    """A file of its own: two errors in the same second (parallel commands) keep both logs."""
    for n in range(100):
        path = folder / (f"{stem}.log" if n == 0 else f"{stem}-{n}.log")
        try:
            with path.open("x") as f:
                f.write(text)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(folder / f"{stem}.log")


def _report(error: BaseException, argv: list[str]) -> str:
    lines = [
        f"autoloop internal error at {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        "command: " + " ".join(["autoloop", *argv]),
        "",
        "versions:",
        f"  autoloop {__version__}",
        f"  Python {sys.version.split()[0]} ({sys.executable}) on {platform.platform()}",
        f"  torch {_torch_version()}",
        f"  {_git_version()}",
        "",
    ]
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return "\n".join(lines) + "\n" + trace


def _torch_version() -> str:
    """The installed torch, read from its metadata: importing it takes seconds, and a broken
    install may raise anything on import."""
    loaded = sys.modules.get("torch")
    if loaded is not None:
        return str(getattr(loaded, "__version__", "unknown version"))
    try:
        return importlib.metadata.version("torch") + " (installed, not imported)"
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
    except Exception as e:  # a broken metadata file must not hide the original error
        return f"unreadable ({type(e).__name__}: {e})"


def _git_version() -> str:
    try:
        out = subprocess.run(["git", "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return f"git: not runnable ({type(e).__name__}: {e})"
    return out.stdout.strip() or f"git: exit status {out.returncode}"
