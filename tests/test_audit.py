"""The held-out audit figure: in the ledger, never in a proposer's request or prompt, never in results.tsv."""

from __future__ import annotations

import json
import time

from helpers.git import TRAIN_PY, init_repo

from autoloop.config.settings import Settings
from autoloop.core.layout import Layout
from autoloop.engine.candidate import proposal_request, strip_audit
from autoloop.proposers.agent import build_prompt
from autoloop.store.ledger import Ledger, LedgerRecord

AUDIT = 3.14159265
# Looked for as text: its first eight places, which no timestamp beside it can hold by chance
# ("3.14" alone was found in a started_at of 1796327133.145319 and failed a CI run).
AUDIT_TEXT = "3.1415926"


def _record(trial: int, metric: float, status: str = "keep") -> LedgerRecord:
    now = time.time()
    return LedgerRecord(trial=trial, started_at=now, ended_at=now, proposer="mutate", commit="a" * 40,
                        description=f"change {trial}", status=status, metric=metric, best="a" * 40,
                        best_metric=metric, extra={"audit_bpb": AUDIT + trial, "source": "x"})


def test_strip_audit_nested():
    assert strip_audit({"a": 1, "audit_bpb": 2, "extra": {"audit_bpb": 3, "source": "s", "deep": {"audit": 1}}}) \
        == {"a": 1, "extra": {"source": "s", "deep": {}}}


def test_audit_never_reaches_a_proposer_or_the_tsv(tmp_path):
    repo = init_repo(tmp_path / "repo", {"train.py": TRAIN_PY.read_text()})
    ledger = Ledger(repo / "results")
    for trial, metric in enumerate([1.5, 1.4, 1.45]):
        ledger.append(_record(trial, metric, "keep" if trial < 2 else "discard"))
    assert AUDIT_TEXT in (repo / "results" / "ledger.jsonl").read_text()   # recorded
    tsv = (repo / "results" / "results.tsv").read_text()
    assert "audit" not in tsv and AUDIT_TEXT not in tsv

    from autoloop.repo.workspace import Workspace
    from autoloop.store import queries

    records = ledger.records()
    request = proposal_request(Settings(), Workspace(repo), Layout.of(repo), records, 3, 1, queries.best(records))
    text = json.dumps(request.ledger_tail)
    assert "audit" not in text and AUDIT_TEXT not in text
    assert request.ledger_tail[0]["extra"] == {"source": "x"}
    prompt = build_prompt(request, tmp_path / "description.txt")
    assert "audit_bpb" not in prompt and AUDIT_TEXT not in prompt   # (the tmp path itself says test_audit)
