"""The proposer interface: one request in, one edit of the target in the work tree out."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from autoloop.core.errors import AutoloopError
from autoloop.store.digest import DEFAULT_BYTES, EarlierNight, Note
from autoloop.store.ledger import LedgerRecord


@dataclass
class FixContext:
    """What went wrong with the previous attempt, for a fix request."""

    crash: str          # crash class: "trivial"
    reason: str         # one-line evidence, e.g. "NameError: name 'lr' is not defined"
    log_tail: str       # the last lines of the failed run's log
    description: str    # what the failed attempt was trying to do


@dataclass
class ProposalRequest:
    workspace: Path                 # the git work tree; the proposer edits the target in place
    target: str                     # path of the file to edit, relative to the workspace
    program_text: str               # program.md: the research instructions
    metric_name: str
    direction: str                  # "min" or "max"
    parent_metric: float | None     # the best it builds on, its metric (None before the baseline)
    parent: str | None              # that best's commit: the proposal's parent
    trial: int
    attempt: int
    seed: int
    ledger_tail: list[dict[str, Any]] = field(default_factory=list)  # recent ledger records (audit fields stripped)
    # The whole ledger (audit fields stripped), for the agent's research digest (digest.py),
    # and the digest's bound in bytes.
    history: list[LedgerRecord] = field(default_factory=list)
    digest_bytes: int = DEFAULT_BYTES
    notes: list[Note] = field(default_factory=list)   # the person's notes in force (person_notes.py)
    guards: list[str] = field(default_factory=list)   # --guard: what a keep must also meet
    fix: FixContext | None = None   # set for a fix request
    results_dir: Path | None = None
    # For proposers that run a process (the agent): the loop's stop request (Ctrl-C, SIGTERM)
    # ends it early, and on_start gets [(pid, create_time)] so that a restart after the
    # orchestrator was killed can end what it left behind.
    stop_event: threading.Event | None = None
    on_start: Callable[[list[tuple[int, float]]], None] | None = None
    # Given to every process the proposer starts (runner.TOKEN_VAR) and saved in the state
    # file first: a restart finds them all by it, even those that left the process tree.
    process_token: str | None = None
    # Parallel workers (candidate.Claims): what the other workers are trying right now, as
    # ledger-like dicts (parent, kind, description), so that no two try the same move at once.
    in_flight: list[dict[str, Any]] = field(default_factory=list)
    # Earlier comparable nights' measured trials (warm_start.EarlierPoint), for the search
    # proposers' memory; empty with --no-warm-start or on a study's first night.
    earlier: list[Any] = field(default_factory=list)
    # The same nights for the research digest's section of earlier nights (store/digest.py).
    earlier_nights: list[EarlierNight] = field(default_factory=list)
    # The kind of device the trial trains on (cpu, cuda, mps): train.py scales some constants
    # by that device's profile, so a proposer bounding a value bounds the one it will train with.
    device: str = "cpu"


@dataclass
class Proposal:
    description: str                # one line: what this change tries
    source: str | None = None       # where it came from (patch file, agent log), for the ledger
    derived: bool = False           # the description was made from the diff, not given by the proposer
    extra: dict[str, Any] = field(default_factory=dict)   # more facts for its ledger record's extra (JSON-ready)


class ProposerError(AutoloopError):
    """No usable proposer for these settings; the message is one line for the user."""


class ProposalFailed(Exception):
    """The proposer could not produce a usable change this time (recorded, loop goes on).
    ``extra``: facts for the skip's record all the same (what a failed agent call cost)."""

    def __init__(self, reason: str, extra: dict[str, Any] | None = None):
        super().__init__(reason)
        self.extra = dict(extra or {})


class Proposer(Protocol):
    name: str
    can_fix: bool                   # whether it can answer fix requests

    def propose(self, request: ProposalRequest) -> Proposal | None:
        """Edit the target in the work tree and describe it; None when out of ideas
        (the loop stops); raise ProposalFailed for a failed attempt."""
        ...
