"""Which repository a command works on, and how a path under it is shown to the user."""

from __future__ import annotations

from pathlib import Path


def repo_root(directory: str) -> Path:
    """The git work tree containing ``directory`` (the directory itself when none: the
    workspace then reports the problem in one line)."""
    path = Path(directory).resolve()
    for candidate in (path, *path.parents):
        if (candidate / ".git").exists():
            return candidate
    return path


def shown_path(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` when it is under it, else whole."""
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
