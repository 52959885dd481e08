"""`autoloop report`: the morning summary (report.md, progress.png), or --since-last's rows."""

from __future__ import annotations

import argparse
from pathlib import Path

from autoloop.cli.paths import repo_root, shown_path


def run(args: argparse.Namespace) -> int:
    from autoloop.core.layout import Layout
    from autoloop.review.report import write_report
    from autoloop.review.since_last import write_mark

    root = repo_root(args.directory)
    results = Layout.of(root).root
    if args.since_last:
        return _report_since_last(root, results)
    files = write_report(results, Path(args.output).resolve() if args.output else results)
    write_mark(results, files.tag, files.records)   # where --since-last starts next time
    shown = [files.markdown] + ([files.picture] if files.picture else [])
    print("wrote " + " and ".join(shown_path(p, root) for p in shown))
    if files.note:
        print(f"no picture: {files.note}")
    for line in files.not_ours:
        print(f"not autoloop's: {line}")
    return 0


def _report_since_last(root: Path, results: Path) -> int:
    """The rows added since the previous report, each kept change with its diff."""
    from autoloop.review.report import ReportError
    from autoloop.review.since_last import read_mark, since_last_text, start_index, write_mark
    from autoloop.store.ledger import Ledger
    from autoloop.store.state import load_state

    ledger = Ledger(results)
    if not ledger.path.exists():
        raise ReportError(f"no ledger at {ledger.path}: nothing to report (run autoloop run first)")
    records = ledger.records()
    tag, mark = load_state(results).tag, read_mark(results)
    print(since_last_text(root, records, start_index(records, mark, tag), mark, tag))
    write_mark(results, tag, records)
    return 0
