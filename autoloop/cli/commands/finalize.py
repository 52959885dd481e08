"""`autoloop finalize`: the kept changes as a clean branch, and what it printed about them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from autoloop.cli.paths import repo_root

if TYPE_CHECKING:
    from autoloop.review.finalize import FinalizeResult


def run(args: argparse.Namespace) -> int:
    from autoloop.review.finalize import finalize
    from autoloop.review.publish import PublishError, check_gh, which_remote

    root = repo_root(args.directory)
    if args.force and args.push is None and not args.pr:
        raise PublishError("--force goes with --push or --pr")
    # Before the branch is made, so that a missing gh or remote leaves nothing half done.
    publishing = args.push is not None or args.pr
    remote = which_remote(root, args.push or None) if publishing else None
    gh = check_gh() if args.pr else None
    result = finalize(root, tag=args.tag, branch=args.branch, squash_overlapping=args.squash_overlapping,
                      results_commit=not args.no_results, drop_unproven=args.drop_unproven)
    n = len(result.commits)
    print(f"created {result.branch}: {n} commit{'s' if n != 1 else ''} on top of the baseline {result.base[:7]}")
    for commit in result.commits:
        print(f"  {commit.sha[:7]} {commit.subject}")
    if result.results:
        print(f"  {result.results.sha[:7]} {result.results.subject} ({', '.join(result.results_paths)})")
    for warning in result.warnings:
        print(f"note: {warning}")
    _print_tree(result)
    print(f"review: git log -p {result.base[:7]}..{result.branch}")
    if remote is not None:
        _publish(args, root, result, remote, gh)
    return 0


def _publish(args: argparse.Namespace, root: Path, result: FinalizeResult, remote: str, gh: str | None) -> None:
    from autoloop.review.publish import publish

    publish(root, result.branch, result.tag or "", result.base, remote, gh, force=args.force, say=print)


def _print_tree(result: FinalizeResult) -> None:
    """What the new branch's tree is: the best without the changes left out, or the best itself."""
    from autoloop.review.finalize import RESULTS_PREFIX

    best = (result.best or "")[:7]   # a branch with kept changes has a best: the ledger's last keep
    for change, verdict in result.dropped:
        print(f"left out: trial {change.record.trial} {change.record.description.splitlines()[0]} "
              f"({verdict if 'autoloop ladder' in verdict else verdict + ' in autoloop verify'})")
    if result.dropped:
        print(f"its tree is the best {best} without the change(s) left out")
    elif result.differs:
        print(f"note: its tree differs from the best commit {best} in {', '.join(result.differs)} "
              "(changes no kept trial made)")
    elif result.best:
        aside = f" (apart from {RESULTS_PREFIX}/)" if result.results else ""
        print(f"its tree equals the best commit {best}{aside}; autoloop/{result.tag} is unchanged")
