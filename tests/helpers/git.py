"""Real git repositories in temporary folders, and the paths of this checkout they start from."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
TRAIN_PY = REPO_ROOT / "train.py"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def init_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    """A real git repo with an identity of its own, one commit, and results/ ignored."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "test@autoloop.invalid")
    git(path, "config", "user.name", "autoloop test")
    git(path, "config", "commit.gpgsign", "false")
    files = {".gitignore": "results/*\n__pycache__/\n", **(files or {})}
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


def private_copy(template: Path, tmp_path: Path) -> Path:
    """A test's own copy of a session-wide template repository (tmp_path/repo)."""
    repo = tmp_path / "repo"
    shutil.copytree(template, repo, symlinks=True)
    return repo
