"""The results ledger: append-only ledger.jsonl (source of truth) and results.tsv derived from it.

INTERFACE STUB - to be implemented (issue 4).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

Status = Literal["keep", "discard", "crash", "skip"]   # skip: proposal failed, nothing was run
CrashClass = Literal["trivial", "fundamental", "timeout"]
# What an attempt was: the unmodified baseline, a new idea, a fix of a trivial crash,
# or a re-run of an earlier candidate (noise confirmation, replay).
AttemptKind = Literal["baseline", "candidate", "fix", "confirm"]

TSV_COLUMNS = ["commit", "val_bpb", "memory_gb", "status", "description", "crash", "trial", "seconds"]


class LedgerRecord(BaseModel):
    trial: int
    attempt: int = 1
    kind: AttemptKind = "candidate"
    started_at: float
    ended_at: float
    proposer: str
    parent: str | None = None          # the best commit the candidate was built on
    commit: str | None = None          # the candidate commit (None when nothing was committed)
    description: str
    status: Status
    crash: CrashClass | None = None
    reason: str = ""                   # one line: why this status (crash evidence, "within noise", ...)
    metric_name: str = "val_bpb"
    metric: float | None = None
    memory_gb: float = 0.0
    training_seconds: float | None = None
    total_seconds: float | None = None
    wall_seconds: float = 0.0          # wall time of the trial process
    exit_code: int | None = None
    signal: int | None = None
    diff_lines: int = 0                # lines added + removed in the target
    seed: int | None = None
    fingerprint: str | None = None     # data fingerprint from the result file
    noise: float | None = None         # noise estimate in force when judged
    log_path: str | None = None
    best: str | None = None            # best commit after this record's decision
    best_metric: float | None = None   # best metric after this record's decision
    outside_changes: list[str] = Field(default_factory=list)  # files reverted by the scope guard
    extra: dict = Field(default_factory=dict)


class Ledger:
    """results/ledger.jsonl + results/results.tsv under one file lock."""

    def __init__(self, results_dir: Path):
        raise NotImplementedError

    def repair(self) -> str | None:
        """Repair a torn last line; return a one-line report of what was done, or None."""
        raise NotImplementedError

    def append(self, record: LedgerRecord) -> None:
        """Append (flush + fsync under the lock), then rewrite results.tsv atomically."""
        raise NotImplementedError

    def records(self) -> list[LedgerRecord]:
        raise NotImplementedError

    def write_tsv(self) -> None:
        raise NotImplementedError
