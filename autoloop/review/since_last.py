"""`autoloop report --since-last`: only the rows added since the previous report.

Every ``autoloop report`` (the full one and this one) leaves a mark in
``results/report-mark.json``: the tag, how many ledger records it covered, and the key of
the last one. ``--since-last`` prints the results.tsv rows of the records after the mark,
each kept change followed by its code diff (from git), and moves the mark. A mark that
does not fit the ledger (another tag's, a ledger that was replaced) is ignored: then every
row is new.

Text from the ledger and from the code under review is printed with escape sequences and
control characters removed (``console.plain``): a description cannot drive the terminal.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from autoloop.observe.console import plain, verbatim_line
from autoloop.repo.gitview import record_diff
from autoloop.store.ledger import TSV_COLUMNS, LedgerRecord, trial_label, tsv_row
from autoloop.store.queries import is_kept_change

MARK_FILE = "report-mark.json"


@dataclass
class Mark:
    tag: str | None
    records: int          # ledger records covered (skips included)
    last: list[float] | None   # [trial, attempt, started_at] of the last covered record
    at: float | None = None


def _key(record: LedgerRecord) -> list[float]:
    return [record.trial, record.attempt, record.started_at]


def read_mark(results_dir: Path) -> Mark | None:
    try:
        data = json.loads((Path(results_dir) / MARK_FILE).read_text())
        return Mark(data.get("tag"), int(data["records"]), data.get("last"), data.get("at"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_mark(results_dir: Path, tag: str | None, records: list[LedgerRecord]) -> None:
    """The previous report now covers ``records`` (written atomically)."""
    path = Path(results_dir) / MARK_FILE
    data = {"tag": tag, "records": len(records), "last": _key(records[-1]) if records else None, "at": time.time()}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def start_index(records: list[LedgerRecord], mark: Mark | None, tag: str | None) -> int:
    """Where the new records begin: after the mark when it fits this ledger, else 0."""
    if mark is None or mark.tag != tag or mark.records > len(records):
        return 0
    if mark.records and _key(records[mark.records - 1]) != mark.last:
        return 0
    return mark.records


def since_last_text(root: Path, records: list[LedgerRecord], start: int, mark: Mark | None,
                    tag: str | None) -> str:
    """What ``--since-last`` prints for the records from ``start`` on."""
    rows = [(r, row) for r in records[start:] if (row := tsv_row(r)) is not None]   # the TSV's rows
    new = [r for r, _ in rows]
    where = f"autoloop/{tag}" if tag else "the ledger"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(mark.at)) if mark and mark.at and start else None
    since = f"since the last report ({when})" if when else "in all (no earlier report of this ledger)"
    if not new:
        return f"no new rows {since}; {where} has {sum(tsv_row(r) is not None for r in records)} rows"
    kept = sum(is_kept_change(r) for r in new)
    out = [f"{len(new)} new row{'s' if len(new) != 1 else ''} {since} on {where}, {kept} kept "
           f"change{'s' if kept != 1 else ''} with {'its' if kept == 1 else 'their'} diff:", "",
           "\t".join(TSV_COLUMNS)]
    for record, row in rows:
        out.append("\t".join(plain(field) or "-" for field in row))
        if is_kept_change(record):
            diff = record_diff(root, record)
            label = trial_label(record.trial, record.attempt)
            if diff is None:
                out.append(f"    (no diff: commit {(record.commit or '')[:7]} of #{label} is not in this repository)")
            else:
                out += [f"    {verbatim_line(line)}" for line in diff.splitlines()]
            out.append("")
    return "\n".join(out).rstrip("\n")
