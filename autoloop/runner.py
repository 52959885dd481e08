"""Run one trial process: budget, hard timeout, whole-tree kill, peak memory, streamed log.

INTERFACE STUB - to be implemented (issue 3). Signatures below are the contract the
orchestrator (loop.py) codes against; keep them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, Field


def default_timeout(budget_s: float) -> float:
    """The hard limit when none is configured: max(2 x budget, budget + 120 s)."""
    return max(2 * budget_s, budget_s + 120)


class TrialSpec(BaseModel):
    command: list[str]                 # argv, e.g. [sys.executable, "train.py"]
    cwd: Path                          # the workspace (git work tree)
    env: dict[str, str] = Field(default_factory=dict)  # merged over os.environ (AUTOLOOP_* contract)
    log_path: Path                     # results/runs/<trial>-<attempt>.log, streamed as it comes
    result_path: Path | None = None    # where autoloop.evaluate writes the result JSON (AUTOLOOP_RESULT)
    budget_s: float = 300.0
    timeout_s: float | None = None     # None -> default_timeout(budget_s)
    metric: str = "val_bpb"
    max_rss_gb: float | None = None    # kill the tree when its total RSS crosses this
    grace_s: float = 5.0               # SIGTERM -> SIGKILL grace period
    sample_interval_s: float = 0.25    # psutil sampling period


class TrialOutcome(BaseModel):
    exit_code: int | None = None       # None when killed by a signal
    signal: int | None = None          # signal number that ended the main process
    timed_out: bool = False
    killed_reason: str | None = None   # "timeout" | "max_rss" | "stopped" (stop_event set) | None
    max_rss_gb: float | None = None    # the cap that was in force (for the reason text)
    metric_name: str = "val_bpb"
    metric: float | None = None        # finite, validated metric; None when missing or invalid
    metric_error: str | None = None    # why the metric is unusable ("val_bpb is nan", disagreement...)
    summary: dict[str, float] = Field(default_factory=dict)  # parsed '---' summary block fields
    result: dict | None = None         # the result JSON as written by autoloop.evaluate
    peak_rss_mb: float = 0.0           # peak resident memory of the whole process tree
    wall_seconds: float = 0.0
    log_path: Path
    log_tail: str = ""                 # last lines of the log (for classification and fix requests)
    started_at: float = 0.0
    ended_at: float = 0.0


def build_env(budget_s: float, seed: int, result_path: Path | None, data_dir: Path | None = None,
              device: str | None = None, nonce: str | None = None) -> dict[str, str]:
    """The AUTOLOOP_* environment of the harness -> train.py contract."""
    raise NotImplementedError


def run_trial(spec: TrialSpec, on_progress: Callable[[str], None] | None = None,
              stop_event: threading.Event | None = None) -> TrialOutcome:
    """Run the trial to completion, timeout, memory cap or stop_event; return only when
    nothing it started is alive."""
    raise NotImplementedError
