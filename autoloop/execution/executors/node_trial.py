"""What the engines that run a trial on a cluster node share (slurm jobs, slurm steps, ray).

The trial runs through ``runner.run_process`` on the node, not as a child of the orchestrator:
the spec goes with absolute paths and a process token chosen here (:func:`for_the_node`),
progress lines are read from the log the node appends to (:class:`LogFollower`), a job or
actor that gave no outcome is turned into one with the evidence (:func:`no_result_outcome`),
and state.json keeps a digest of the trial's nonce to check a result found by ``--resume``
(:func:`nonce_digest`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

from autoloop.execution.executors import OnProgress
from autoloop.execution.procs import TOKEN_VAR
from autoloop.execution.runner import PROGRESS_RE, RunOutcome, RunSpec, default_timeout


def for_the_node(spec: RunSpec) -> tuple[RunSpec, str]:
    """The spec with absolute paths (the node's working directory is not ours) and the
    timeout in force, and its process token, chosen here so that the trial's processes can
    be found from here."""
    token = spec.env.get(TOKEN_VAR) or uuid.uuid4().hex
    spec = spec.model_copy(update={
        "env": {**spec.env, TOKEN_VAR: token},
        "cwd": Path(spec.cwd).absolute(), "log_path": Path(spec.log_path).absolute(),
        "result_path": Path(spec.cwd, spec.result_path).absolute() if spec.result_path else None,
        "timeout_s": spec.timeout_s if spec.timeout_s is not None else default_timeout(spec.budget_s)})
    return spec, token


class LogFollower:
    """Reads what the node appended to the trial's log since the last look, for progress lines."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.last: str | None = None

    def poll(self, on_progress: OnProgress | None) -> None:
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self.offset:   # a new log (the job restarted): read it from the start
                    self.offset = 0
                f.seek(self.offset)
                data = f.read(size - self.offset)
        except OSError:
            return
        end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1   # whole lines only
        self.offset += end
        last = None
        for found in PROGRESS_RE.finditer(data[:end]):
            last = found
        if last is not None:
            self.last = last.group().decode(errors="replace").strip()
            if on_progress is not None:
                with contextlib.suppress(Exception):   # a display bug must not lose the trial
                    on_progress(self.last)


def no_result_outcome(spec: RunSpec, started_at: float, t0: float, follower: LogFollower, info: dict[str, Any],
                      job_error: str | None = None, launch_error: str | None = None, stopped: bool = False,
                      timed_out: bool = False, note: str | None = None) -> RunOutcome:
    """A RunOutcome for a job, a step or an actor that gave none; the evidence goes into
    the trial's log too."""
    note = note or launch_error
    if note:
        with contextlib.suppress(OSError), open(spec.log_path, "a") as f:
            f.write(f"\n[autoloop] {note}\n")
    tail = ""
    with contextlib.suppress(OSError):
        tail = "\n".join(spec.log_path.read_text(errors="replace").splitlines()[-200:])
    return RunOutcome(
        exit_code=126 if launch_error else None, launch_error=launch_error, job_error=job_error,
        killed_reason="stopped" if stopped else ("timeout" if timed_out else None), timed_out=timed_out,
        max_rss_gb=spec.max_rss_gb, metric_name=spec.metric, log_path=spec.log_path, log_tail=tail,
        started_at=started_at, ended_at=time.time(), wall_seconds=time.monotonic() - t0,
        timeout_s=spec.timeout_s, last_progress=follower.last, job=info)


def nonce_digest(nonce: str | None) -> str | None:
    """What state.json keeps of the trial's nonce: enough to check a result by, not to forge one."""
    return hashlib.sha256(nonce.encode()).hexdigest() if nonce else None
