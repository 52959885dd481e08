"""The arbiter: the one owner of the night's current best.

Every worker slot hands it each finished attempt. Under its lock (one at a time, whatever
the number of slots) it judges the attempt against the best as it is *now*
(``keep.decide``), builds the record, appends it to the ledger (the commit point), tells the
observers, and moves the loop's branch ``autoloop/<tag>`` (the main checkout) to the new
best. It is the only place a record's ``best`` is set, so the ledger's best only improves.

The lock also serialises what the slots share besides: the inputs snapshot's checks and
restores, and reserving trial numbers. The records are kept in memory as appended (this
process is the workspace's only writer: the workspace lock), so that the queries every
attempt asks cost no reading of the ledger.

``observers`` are called with each record right after it is appended (trackers, git notes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

from autoloop.core.keep import Decision, Facts, Rules, decide
from autoloop.repo.workspace import Workspace
from autoloop.store import queries
from autoloop.store.ledger import Draft, Ledger, LedgerRecord

Observer = Callable[[LedgerRecord], None]
Merge = Literal["clean", "conflict", "already_in"]   # Facts.merge: how a change went onto a moved best


class Arbiter:
    def __init__(self, ledger: Ledger, main: Workspace, rules: Rules):
        self.lock = threading.RLock()
        self.ledger = ledger
        self.main = main
        self.rules = rules
        self.observers: list[Observer] = []
        self._records = ledger.records()

    # -- what the ledger says -------------------------------------------------------------

    def records(self) -> list[LedgerRecord]:
        with self.lock:
            return list(self._records)

    def best(self) -> queries.Best:
        with self.lock:
            return queries.best(self._records)

    def noise(self) -> float | None:
        with self.lock:
            return queries.noise(self._records)

    def reload(self) -> None:
        """Read the ledger again (after it was moved aside for a new tag)."""
        with self.lock:
            self._records = self.ledger.records()

    # -- judging and recording -----------------------------------------------------------

    def decide(self, facts: Facts, ws: Workspace) -> tuple[Decision, str | None]:
        """The decision on a finished attempt against the best now, and, when the best moved
        while it ran, its change merged onto the new best (None when it does not merge)."""
        with self.lock:
            current = self.best()
            merged = None
            facts = replace(facts, current=current, rules=self.rules)
            now, parent = current[0], facts.parent[0]
            # The best moved (another worker kept) since it started; only the baseline has no parent.
            if (now and parent and now != parent and facts.commit and facts.noise_sample is None
                    and facts.kind not in ("baseline", "verify", "scout")):
                merged = ws.merge_change(parent, now, facts.commit)
                merge: Merge = ("conflict" if merged is None
                                else "already_in" if merged == ws.file_at(now, ws.target) else "clean")
                facts = replace(facts, merge=merge)
            return decide(facts), merged

    def record(self, draft: Draft, decision: Decision, worker: int | None) -> LedgerRecord:
        """The record of a decided attempt (or a skip): the draft and the decision, appended;
        git follows it."""
        with self.lock:
            record = LedgerRecord(
                **draft.measured(), worker=worker,
                status=decision.status, crash=decision.crash, reason=decision.reason,
                best=decision.best[0], best_metric=decision.best[1], noise=decision.noise,
                confidence=decision.confidence,
                next=decision.action if decision.action in ("confirm", "replay", "promote") else None,
                extra={**draft.extra, **decision.extra})
            if not decision.metric_valid:
                record.metric = None
            # The ledger's line is the commit point; results.tsv is derived from it, rewritten
            # last. A refused TSV write (a full disk) raised between the two, so the record was
            # on disk but not in memory and the branch not moved: the other worker judged against
            # the old best and kept a change without this one (the chaos night, ENOSPC on the TSV).
            self.ledger.append(record, write_tsv=False)
            self._records.append(record)
            for observe in self.observers:
                observe(record)
            if decision.status == "keep":
                self.publish()
            self.ledger.write_tsv()
            return record

    def publish(self) -> None:
        """The loop's branch (checked out in the main checkout) follows the ledger's best."""
        with self.lock:
            best = self.best()[0]
            if best and self.main.head() != best:
                self.main.reset_to(best)
