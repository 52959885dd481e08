"""`autoloop init DIR`: a fresh experiment repository with train.py, program.md and a first commit."""

from __future__ import annotations

import argparse
import shutil
from importlib import resources
from pathlib import Path

import git

from autoloop.core.errors import AutoloopError
from autoloop.core.layout import RESULTS, WORKTREES, Layout

GITIGNORE = f"""# autoloop: ledger, logs and reports stay out of git, so resets never touch them.
{RESULTS}/*
!{RESULTS}/README.md
{WORKTREES}/
__pycache__/
# what an agent following autoresearch's instructions writes (uv run train.py > run.log)
run.log
"""


class ScaffoldError(AutoloopError):
    """The folder cannot be made into an experiment repository; one line for the user."""


def run(args: argparse.Namespace) -> int:
    clients = getattr(args, "install", None) or []
    path = init_experiment(Path(args.path), clients)
    print(f"created an experiment repository in {path}")
    if clients:
        print(f"with the MCP configuration of {', '.join(dict.fromkeys(clients))} (docs/agents.md)")
    print(f"next: cd {path} && autoloop run --budget 5m --hours 8")
    return 0


def template_text(name: str) -> str:
    """A template shipped inside the package (train.py, program.md)."""
    return resources.files("autoloop").joinpath("templates", name).read_text()


def init_experiment(path: Path, clients: list[str] | None = None) -> Path:
    """``clients``: coding agents whose MCP configuration and instructions go in the first commit."""
    from autoloop.review.mcp.client_setup import install

    path = path.resolve()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ScaffoldError(f"{path} exists and is not an empty folder")
    path.mkdir(parents=True, exist_ok=True)
    try:
        (path / "train.py").write_text(template_text("train.py"))
        (path / "program.md").write_text(template_text("program.md"))
        (path / ".gitignore").write_text(GITIGNORE)
        readme = Layout.of(path).ensure().root / "README.md"
        readme.write_text("Ledger, logs and reports of autoloop (git-ignored).\n")
        extra = [p.relative_to(path).as_posix() for p in install(path, clients or [])]
        repo = git.Repo.init(path)
        repo.index.add(["train.py", "program.md", ".gitignore", readme.relative_to(path).as_posix(), *extra])
        author = None
        reader = repo.config_reader()
        if not (reader.has_option("user", "name") and reader.has_option("user", "email")):
            author = git.Actor("autoloop", "autoloop@localhost")
        repo.index.commit("autoloop experiment: baseline train.py and program.md", author=author, committer=author)
        repo.close()
    except (OSError, git.GitError) as e:
        shutil.rmtree(path, ignore_errors=True)
        raise ScaffoldError(f"could not create {path}: {e}") from None
    return path
