"""A request from another shell that the night stop after its running trial(s).

``results/stop-request.json`` holds the orchestrator's pid and the time of the request. The
scheduler takes it (reads and removes it) before each new trial: for its own pid the night
stops as though it had reached --max-trials, each running trial finished and recorded; a
request for another pid (an orchestrator long gone) is removed and ignored, so a stale file
never stops a later night.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from autoloop.core.layout import Layout
from autoloop.store.atomic import atomic_write


def request_stop(results_dir: Path, pid: int, now: float | None = None) -> Path:
    """Ask the orchestrator ``pid`` to stop after the trials it is running."""
    path = Layout(Path(results_dir)).stop_request
    atomic_write(path, json.dumps({"pid": pid, "at": time.time() if now is None else now}) + "\n")
    return path


def pending_request(results_dir: Path) -> dict[str, float] | None:
    """The request waiting, if any (a file that is not a request counts as none)."""
    try:
        data = json.loads(Layout(Path(results_dir)).stop_request.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        return None
    return {"pid": data["pid"], "at": float(data.get("at") or 0.0)}


def take_request(results_dir: Path, pid: int) -> str | None:
    """The stop reason when a request for ``pid`` waits; the file is removed either way."""
    path = Layout(Path(results_dir)).stop_request
    if not path.exists():
        return None
    request = pending_request(results_dir)
    path.unlink(missing_ok=True)
    if request is None or request["pid"] != pid:
        return None
    return f"stop requested at {time.strftime('%H:%M:%S', time.localtime(request['at']))} (stop_after_trial)"
