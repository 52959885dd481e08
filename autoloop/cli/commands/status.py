"""`autoloop status`: where the loop stands, read from results/ (safe while it runs)."""

from __future__ import annotations

import argparse

from autoloop.cli.paths import repo_root


def run(args: argparse.Namespace) -> int:
    from autoloop.core.layout import Layout
    from autoloop.review.json_forms import status_payload
    from autoloop.review.status import status_data, status_json, status_text

    data = status_data(Layout.of(repo_root(args.directory)).root)
    print(status_json(status_payload(data)) if args.json else status_text(data))
    return 0
