"""The orchestrator's state file: which attempt is in flight and in what phase.

``results/state.json`` (and ``state-w<k>.json`` for parallel worker k) is rewritten
atomically at every phase change, *before* the phase starts, so that after a ``kill -9``
at any moment the next start knows exactly what was interrupted: the trial and attempt,
the best commit it was built on, the candidate commit if one was made, and the pids (and
token, and job) of the processes it had started, to end them. The phases of one attempt,
in order: proposing, committing, running, judging, then idle; ``stopped`` ends a run.

:class:`StateFile` is one such file held by one worker slot of the engine; it is also
where the fault-injection points of the recovery tests sit (``fault_point``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from autoloop.core.layout import STATE, Layout
from autoloop.store.atomic import atomic_write

Phase = Literal["idle", "proposing", "committing", "running", "judging", "stopped"]
STATE_FILE = STATE


class RunState(BaseModel):
    tag: str | None = None
    phase: Phase = "idle"
    pid: int | None = None               # the orchestrator holding the workspace
    run_started_at: float | None = None  # when this `autoloop run` started
    deadline: float | None = None        # when no further trial may end (from --hours)
    trial: int | None = None
    attempt: int | None = None
    kind: str | None = None
    description: str | None = None
    proposer: str | None = None
    best: str | None = None              # best commit when this attempt began
    best_metric: float | None = None
    candidate: str | None = None         # candidate commit, once made
    phase_started_at: float | None = None
    attempt_started_at: float | None = None
    child_pids: list[tuple[int, float]] = Field(default_factory=list)  # (pid, create_time) to end on recovery
    child_token: str | None = None       # AUTOLOOP_TRIAL_TOKEN of the agent's processes, to end on recovery
    job: dict[str, Any] | None = None    # the executor's job running the trial (executor slurm), to cancel on recovery
    progress: str | None = None          # the latest progress line of the running trial
    stop_reason: str | None = None
    stopped_at: float | None = None
    workers: int | None = None           # parallel workers (their states: state-w<k>.json); None: one loop

    @property
    def in_flight(self) -> bool:
        return self.phase not in ("idle", "stopped")


def state_path(results_dir: Path, name: str = STATE_FILE) -> Path:
    return Layout(Path(results_dir)).state(name)


def worker_state_name(worker: int) -> str:
    """A parallel worker's own state file: each has its attempt in flight."""
    return Layout.worker_state_name(worker)


def load_state(results_dir: Path, name: str = STATE_FILE) -> RunState:
    path = state_path(results_dir, name)
    try:
        return RunState.model_validate_json(path.read_text())
    except FileNotFoundError:
        return RunState()
    except ValueError:
        # A state file is only a hint for recovery; the ledger is the source of truth.
        return RunState()


def save_state(results_dir: Path, state: RunState, name: str = STATE_FILE) -> None:
    path = state_path(results_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(state.model_dump(mode="json")), sync_dir=False)


def set_phase(results_dir: Path, state: RunState, phase: Phase, name: str = STATE_FILE, **fields: Any) -> RunState:
    """Move to ``phase`` (updating ``fields``) and persist it before anything else happens."""
    now = time.time()
    updated = state.model_copy(update={"phase": phase, "phase_started_at": now, **fields})
    save_state(results_dir, updated, name)
    return updated


def fault_point(name: str, trial: int | None, attempt: int | None = None) -> None:
    """Fault injection for the recovery tests and the soak benchmark: with
    AUTOLOOP_FAULT_KILL_AT=<point>:<trial> (or <point>:<trial>.<attempt>, e.g. running:1.2
    for a confirmation re-run; or <point> alone: the first time it is reached) the
    orchestrator SIGKILLs itself there. The points are the phases (on entering them),
    proposed, committed, recorded (just after each), replaying (a replay decided and
    recorded, before it runs) and prepared (a look-ahead candidate saved, lookahead.py)."""
    wanted = os.environ.get("AUTOLOOP_FAULT_KILL_AT")
    if wanted and wanted in (name, f"{name}:{trial}", f"{name}:{trial}.{attempt}"):
        os.kill(os.getpid(), signal.SIGKILL)


class StateFile:
    """One state file and the state it holds, for the one thread that writes it."""

    def __init__(self, results_dir: Path, name: str = STATE_FILE, state: RunState | None = None):
        self.results_dir, self.name = Path(results_dir), name
        self.state = state if state is not None else load_state(self.results_dir, name)

    @property
    def path(self) -> Path:
        return state_path(self.results_dir, self.name)

    def enter(self, phase: Phase, **fields: Any) -> None:
        """Persist the phase (and fields) before anything of it happens."""
        self.state = set_phase(self.results_dir, self.state, phase, self.name, **fields)
        fault_point(phase, self.state.trial, self.state.attempt)

    def update(self, **fields: Any) -> None:
        """Persist more of the current phase (the pids it started, its progress)."""
        self.state = self.state.model_copy(update=fields)
        save_state(self.results_dir, self.state, self.name)

    def replace(self, state: RunState) -> None:
        self.state = state
        save_state(self.results_dir, state, self.name)
