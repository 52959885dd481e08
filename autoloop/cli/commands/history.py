"""`autoloop history`: the study's nights as a table or as JSON (safe while a night runs)."""

from __future__ import annotations

import argparse

from autoloop.cli.paths import repo_root


def run(args: argparse.Namespace) -> int:
    from autoloop.core.layout import Layout
    from autoloop.repo.gitview import branch_names
    from autoloop.review.history import history_payload, to_json, to_text

    root = repo_root(args.directory)
    payload = history_payload(Layout.of(root).root, branch_names(root))
    print(to_json(payload) if args.json else to_text(payload))
    return 0
