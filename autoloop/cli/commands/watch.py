"""`autoloop watch`: the night, live, in the terminal (read-only)."""

from __future__ import annotations

import argparse

from autoloop.cli.paths import repo_root


def run(args: argparse.Namespace) -> int:
    from autoloop.review.watch.live import watch

    try:
        return watch(repo_root(args.directory), interval=args.interval, last=args.last, once=args.once)
    except KeyboardInterrupt:   # Ctrl-C is a way to quit, as q is; the night is not touched
        return 0
