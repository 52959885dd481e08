"""Is a night running in this workspace now? Read from ``state.json`` alone, without the lock.

The orchestrator holds the workspace lock (engine/opening.py) and records its pid and its
start in ``state.json``; taking the lock to ask would, for that instant, refuse a night
starting then, so this only reads. A pid that is alive but started after the night did
(the pid reused by another process after a kill) is not the night.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autoloop.store.state import load_state

# psutil's create_time and the state's run_started_at come from two clocks' readings; a
# process that started this much after the recorded start is another process.
START_SLACK_S = 5.0


@dataclass(frozen=True)
class RunningNight:
    pid: int
    tag: str | None
    since: float | None        # when that `autoloop run` started (epoch seconds)
    phase: str


def running_night(results_dir: Path) -> RunningNight | None:
    """The night running now, None when the state file names no live orchestrator."""
    state = load_state(Path(results_dir))
    if state.phase == "stopped" or not state.pid:
        return None
    import psutil

    started: float | None = None
    try:
        started = psutil.Process(state.pid).create_time()
    except psutil.NoSuchProcess:   # a zombie too: the night is over
        return None
    except psutil.AccessDenied:    # alive, its start unreadable: taken as the night
        pass
    if started is not None and state.run_started_at is not None and started > state.run_started_at + START_SLACK_S:
        return None
    return RunningNight(state.pid, state.tag, state.run_started_at, state.phase)
