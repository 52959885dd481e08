"""`autoloop dashboard`: the live, read-only web page of the night."""

from __future__ import annotations

import argparse

from autoloop.cli.paths import repo_root


def run(args: argparse.Namespace) -> int:
    from autoloop.review.dashboard.server import serve

    try:
        serve(repo_root(args.directory), args.host, args.port, print_flush)
    except KeyboardInterrupt:
        print("dashboard stopped")
    return 0


def print_flush(text: str) -> None:
    """A line out at once: the URL must show while the server blocks, stdout piped or not."""
    print(text, flush=True)
