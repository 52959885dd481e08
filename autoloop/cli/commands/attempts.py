"""`autoloop attempts`: the night's attempts as a table or as JSON (safe while it runs)."""

from __future__ import annotations

import argparse

from autoloop.cli.paths import repo_root


def run(args: argparse.Namespace) -> int:
    from autoloop.core.layout import Layout
    from autoloop.review.attempts import read_records, select, to_json, to_text

    payload = select(read_records(Layout.of(repo_root(args.directory)).root), status=args.status,
                     crash=args.crash, since=args.since, kept=args.kept, limit=args.limit)
    print(to_json(payload) if args.json else to_text(payload))
    return 0
