"""What every git process autoloop starts runs with, so that none of an agent's code runs inside it.

The agent and train.py run as the person: they can write ``.git/config``, ``.git/hooks``,
``.git/info/attributes`` and ``~/.gitconfig``. Without this, a ``post-commit`` or
``reference-transaction`` hook, or ``core.fsmonitor`` set to a script, ran inside the
harness's own ``git commit``/``update-ref``/``status`` all night (tried: all three ran).
What git can be made to execute, and how each is shut off here (the one definition; both
ways autoloop starts git apply it: ``procs.run_own_group`` and GitPython's runner in
``repo/workspace.py``, through ``procs.neutral_git``):

* hooks, every one of them: ``core.hooksPath`` is the null device (no file is under it);
* ``core.fsmonitor``: ``false``;
* signing (``gpg.program``): ``commit.gpgSign``/``tag.gpgSign`` ``false``;
* ``diff.external``, ``diff.<driver>.command`` and ``textconv``: ``--no-ext-diff
  --no-textconv`` on ``diff``/``log``/``show``, and ``GIT_EXTERNAL_DIFF`` dropped;
* clean/smudge filters (``filter.<driver>.*`` named by any attributes file): their names
  are free, so the drivers the configuration defines are listed (``git config
  --get-regexp``, which runs nothing) right before a command that may filter, and each is
  emptied (an empty command is no filter; ``required`` off, or git would fail instead);
* aliases: never used (a builtin's name cannot be aliased).

The values are passed as ``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_<n>``/``GIT_CONFIG_VALUE_<n>``
(git 2.31+), after any the person set: command-scope configuration, above every file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

NEUTRAL: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", os.devnull),
    ("core.fsmonitor", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
)
DROPPED = ("GIT_EXTERNAL_DIFF",)
DIFF_FLAGS = ("--no-ext-diff", "--no-textconv")
_DIFFING = {"diff", "log", "show"}
# Commands that never read or write work-tree files through attributes: no filter listing
# before them (the listing is a process of its own; these are most of the harness's calls).
_NO_FILTERS = {"cat-file", "check-ignore", "check-ref-format", "commit-tree", "config", "for-each-ref",
               "ls-tree", "merge-base", "merge-file", "read-tree", "rev-list", "rev-parse", "symbolic-ref",
               "update-ref", "var", "version", "write-tree", "log", "show", "notes", "branch"}
FILTER_LISTING = ("config", "-z", "--name-only", "--get-regexp", r"^filter\.")

Runner = Callable[[list[str], dict[str, str], "str | None"], "tuple[int, bytes]"]


def is_git(argv: Sequence[str]) -> bool:
    return bool(argv) and Path(str(argv[0])).name in ("git", "git.exe")


def subcommand(argv: Sequence[str]) -> str | None:
    """The git command of an argv (``git [options] <command> ...``); options taking a value are not used."""
    return next((str(a) for a in argv[1:] if not str(a).startswith("-")), None)


def safe_argv(argv: Sequence[str]) -> list[str]:
    """argv with external diff and textconv programs off where git would run them."""
    out = [str(a) for a in argv]
    sub = subcommand(out)
    if sub in _DIFFING:
        at = out.index(sub) + 1
        out[at:at] = [f for f in DIFF_FLAGS if f not in out]
    return out


def drivers(listing: bytes) -> list[str]:
    """Filter driver names in ``git config -z --name-only --get-regexp ^filter\\.``'s output."""
    names = []
    for key in listing.decode("utf-8", "replace").split("\0"):
        key = key.strip()
        if key.startswith("filter.") and key.count(".") >= 2:
            name = key[len("filter."):key.rindex(".")]
            if name not in names:
                names.append(name)
    return names


def neutral_env(base: Mapping[str, str], filter_drivers: Sequence[str] = ()) -> dict[str, str]:
    """``base`` plus the neutralising configuration (after the person's own GIT_CONFIG_*)."""
    env = {k: v for k, v in base.items() if k not in DROPPED}
    pairs = list(NEUTRAL)
    for name in filter_drivers:
        pairs += [(f"filter.{name}.{key}", "") for key in ("clean", "smudge", "process")]
        pairs.append((f"filter.{name}.required", "false"))
    try:
        start = max(0, int(env.get("GIT_CONFIG_COUNT") or 0))
    except ValueError:
        start = 0   # git would refuse a bogus count: ours replaces it
    for i, (key, value) in enumerate(pairs, start):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    env["GIT_CONFIG_COUNT"] = str(start + len(pairs))
    return env


def prepare(argv: Sequence[str], base: Mapping[str, str], cwd: str | None,
            run: Runner) -> tuple[list[str], dict[str, str]]:
    """The argv and environment a git command runs with. ``run(argv, env, cwd) -> (code, stdout)``
    starts the filter listing (out of the terminal's group, as the caller's git)."""
    argv = safe_argv(argv)
    env = neutral_env(base)
    if subcommand(argv) in _NO_FILTERS:
        return argv, env
    code, out = run([argv[0], *FILTER_LISTING], env, cwd)
    return argv, neutral_env(base, drivers(out) if code == 0 else ())
