"""`autoloop finalize --push [REMOTE]` and `--pr`: the morning's branch published.

``--push`` pushes the branch finalize just made (never the loop's own branch
``autoloop/<tag>``, and with ``--force-with-lease`` only when ``--force`` asks) to REMOTE,
by default ``origin``, else the repository's only remote. ``--pr`` pushes and opens a pull
request through the GitHub CLI (``gh pr create``), which owns the login and the rights: its
body is the report's summary, the kept changes with their verified contributions (when
``autoloop verify`` ran) and the results.tsv rows the branch adds. A missing ``gh``, a ``gh``
not logged in, no remote or no rights to push are each one line, and nothing is half done
that the line does not name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from autoloop.core.errors import AutoloopError
from autoloop.core.layout import Layout, branch_name
from autoloop.execution.gitsafe import neutral_env, safe_argv
from autoloop.review import report
from autoloop.store import queries
from autoloop.store.ledger import Ledger, LedgerRecord

MAX_DIFF_LINES = 400       # of the results.tsv diff in a pull request's body (GitHub caps it at 65536 characters)
GIT_TIMEOUT_S = 300.0


class PublishError(AutoloopError):
    """The branch cannot be pushed or the pull request opened; one line for the user."""


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(safe_argv(["git", *args]), cwd=root, env=neutral_env(os.environ), capture_output=True,
                          text=True, timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("hint:")]
    return (lines[-1] if lines else "no output").removeprefix("fatal: ").removeprefix("error: ")


def which_remote(root: Path, remote: str | None) -> str:
    """The remote asked for, else origin, else the only one; PublishError naming what is missing."""
    remotes = _git(root, "remote").stdout.split()
    if remote:
        if remote not in remotes:
            raise PublishError(f"--push: no remote named {remote!r} (this repository has: "
                               f"{', '.join(remotes) or 'none'}; add one with `git remote add {remote} URL`)")
        return remote
    if "origin" in remotes:
        return "origin"
    if len(remotes) == 1:
        return remotes[0]
    if not remotes:
        raise PublishError("--push: this repository has no remote (add one with `git remote add origin URL`)")
    raise PublishError(f"--push: several remotes and none is origin ({', '.join(remotes)}): name one, --push REMOTE")


def push(root: Path, branch: str, tag: str, remote: str | None = None, force: bool = False) -> str:
    """Push ``branch`` to the remote (returned); never the loop's branch, no force unless asked."""
    if branch == branch_name(tag) or branch.startswith(f"{branch_name(tag)}-w"):
        raise PublishError(f"--push: {branch} is the loop's own branch; only finalize's branch is pushed")
    remote = which_remote(root, remote)
    args = ["push", "--porcelain", *(["--force-with-lease"] if force else []), remote,
            f"refs/heads/{branch}:refs/heads/{branch}"]
    done = _git(root, *args)
    if done.returncode != 0:
        why = _last_line(done.stderr)
        if "rejected" in done.stdout + done.stderr and not force:
            why = f"{branch} on {remote} has other commits (rejected; --force replaces it)"
        raise PublishError(f"--push: git push to {remote} failed: {why}")
    return remote


# ------------------------------------------------------------------------------ the pull request


def pr_title(records: list[LedgerRecord], tag: str) -> str:
    baseline, best = queries.baseline(records), queries.best_record(records)
    kept = len(report.kept_changes(queries.of_night(records)))
    metric = best.metric_name if best else "val_bpb"
    if baseline and best and baseline.best_metric is not None and best.best_metric is not None:
        return (f"autoloop {tag}: {metric} {baseline.best_metric:.4f} -> {best.best_metric:.4f} "
                f"({kept} kept change{'s' if kept != 1 else ''})")
    return f"autoloop {tag}: the night's kept changes"


def pr_body(root: Path, tag: str, base: str, branch: str) -> str:
    """The report's summary, the kept changes (with verify's contributions) and the results.tsv diff."""
    results = Layout.of(root)
    records = Ledger(results.root).records()
    night = queries.of_night(records)
    baseline = queries.baseline(night)
    metric = night[-1].metric_name if night else "val_bpb"
    kept = report.kept_changes(night)
    lines = report.header_lines(night, tag, metric, queries.infer_direction(night), None)
    lines += report.result_section(night, baseline, metric, len(kept))
    lines += report.kept_section(kept, metric)
    lines += _verification(results, records, tag)
    diff = _git(root, "diff", "--no-color", base, f"refs/heads/{branch}", "--", "results/results.tsv").stdout
    if diff.strip():
        shown = diff.splitlines()
        cut = len(shown) - MAX_DIFF_LINES
        lines += ["## results.tsv", "", "```diff", *shown[:MAX_DIFF_LINES], "```", ""]
        if cut > 0:
            lines += [f"_{cut} more lines: `git diff {base[:7]} {branch} -- results/results.tsv`_", ""]
    lines += ["_Opened by `autoloop finalize --pr`; descriptions are the proposer's own words._", ""]
    return "\n".join(lines)


def _verification(results: Layout, records: list[LedgerRecord], tag: str) -> list[str]:
    """The report's Verification section (each kept change's contribution), without its
    picture: a pull request's body cannot show a file of results/."""
    from autoloop.verification.verify_plan import load_plan, summarize

    plan = load_plan(results)
    if plan is None or plan.tag != tag:
        return []
    return report.verification_section(summarize(plan, records), None)


def check_gh() -> str:
    """The gh executable, logged in; else PublishError in one line (nothing pushed yet)."""
    gh = shutil.which("gh")
    if gh is None:
        raise PublishError("--pr: the GitHub CLI (gh) is not installed (https://cli.github.com); "
                           "push with --push and open the pull request by hand")
    done = subprocess.run([gh, "auth", "status"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise PublishError(f"--pr: gh is not logged in ({_last_line(done.stderr + done.stdout)}); run `gh auth login`")
    return gh


def open_pr(root: Path, gh: str, branch: str, title: str, body: str) -> str:
    """`gh pr create` for the pushed branch; its URL (what gh printed last)."""
    with tempfile.TemporaryDirectory(prefix="autoloop-pr-") as tmp:
        body_file = Path(tmp) / "body.md"
        body_file.write_text(body)
        done = subprocess.run([gh, "pr", "create", "--head", branch, "--title", title, "--body-file", str(body_file)],
                              cwd=root, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise PublishError(f"--pr: gh pr create failed: {_last_line(done.stderr + done.stdout)}")
    return _last_line(done.stdout)


def publish(root: Path, branch: str, tag: str, base: str, remote: str, gh: str | None, force: bool,
            say: Callable[[str], None]) -> None:
    """Push the branch; with ``gh`` (check_gh's), open its pull request. Each step said."""
    push(root, branch, tag, remote, force=force)
    say(f"pushed {branch} to {remote}")
    if gh is not None:
        title = pr_title(Ledger(Layout.of(root).root).records(), tag)
        say(f"pull request: {open_pr(root, gh, branch, title, pr_body(root, tag, base, branch))}")
