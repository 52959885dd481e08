"""Run one supervised process: budget, hard timeout, whole-tree kill, peak memory, streamed log.

A *run* is one command started in a session of its own: a trial's training (``python
train.py`` by default), an agent call, a ``--check`` command. While it runs, a reader
thread streams its merged stdout/stderr to the log file and keeps only a bounded tail in
memory; the calling thread samples the process tree every ``sample_interval_s`` for memory
and enforces the hard timeout, the memory cap and the orchestrator's stop request. Ending a
run means ending everything it started: the process group, every descendant ever seen (by
pid and start time, so a reused pid is never hit), and any process that still carries the
run's private token in its environment, which finds daemons that double-forked and left the
session before any sample saw them. ``run_process`` returns only when none of them is alive.

With ``log_cap_bytes`` the log keeps the first and the last half of the output around one
line saying how much was cut (``autoloop.store.runlog``); with ``isolate`` the trial runs in a
network namespace of its own (``autoloop.execution.isolate``), entered between fork and exec so the
session, token and subreaper arrangements above are unchanged.

Decisions the contracts leave open (docs/architecture.md, "Contracts"):
  * The child's ``AUTOLOOP_RESULT`` is always the file the runner reads (``result_path``,
    else the spec's own ``AUTOLOOP_RESULT``); an inherited value is dropped, so a trial
    can never write a result somewhere nobody looks.
  * Relative ``result_path`` is taken relative to ``cwd``, as the child sees it.
  * ``AUTOLOOP_TIMEOUT_S`` is the hard limit in force for this run (after a precheck's share),
    so that train.py's ranks give up waiting on each other before the runner kills them.
  * ``PYTHONFAULTHANDLER=1`` (unless set) makes a segfaulting Python print its stack into
    the log, which is the only evidence a proposer gets for a crash in native code.
  * On Linux the runner is the child subreaper while a trial runs, so orphans of the trial
    are re-parented to it (not to init), stay visible to sampling, and are reaped after
    they are killed: in containers whose init never reaps, they would stay zombies.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import select
import shlex
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import IO, Any, Protocol

from pydantic import BaseModel, Field, field_validator

from autoloop.core.durations import default_timeout
from autoloop.execution.cgroups import RunGroup
from autoloop.execution.isolate import enter_network_namespace, isolation_available
from autoloop.execution.procs import TOKEN_VAR, ProcessTree, adopting_orphans
from autoloop.store.runlog import RunLog

__all__ = ["TOKEN_VAR", "RunOutcome", "RunSpec", "build_env", "default_timeout", "run_process"]

logger = logging.getLogger(__name__)

TAIL_BYTES = 64 * 1024        # log tail kept in memory: enough for any traceback + summary block
TAIL_LINES = 200
READ_CHUNK = 1 << 20          # big reads: a trial flooding stdout costs few system calls
MAX_LINE = 4096               # longer lines cannot be progress or metric lines; not carried over
PROGRESS_PREFIX = b"step "    # train.py (and autoresearch) progress lines

# A line starts after \n or \r: autoresearch redraws its progress line with \r.
_LINE_START = rb"(?:^|(?<=[\r\n]))"
_NUMBER = rb"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf(?:inity)?)"
PROGRESS_RE = re.compile(_LINE_START + re.escape(PROGRESS_PREFIX) + rb"[^\r\n]*")
_EOL_RE = re.compile(rb"[\r\n]")
_SUMMARY_LINE_RE = re.compile(r"^(\w+):\s*(" + _NUMBER.decode() + r")\s*$", re.IGNORECASE)


def default_command() -> list[str]:
    """The interpreter running the harness, on the workspace's train.py."""
    return [sys.executable, "train.py"]



class StopSignal(Protocol):
    """What ends a run early: a threading.Event, or an agent call's output watch (which
    ends the call at a fatal line). Only is_set() is read, from the supervising loop."""

    def is_set(self) -> bool: ...

class RunSpec(BaseModel):
    """What one run is: its command, where and with what, and the limits it runs under."""

    # argv, e.g. [sys.executable, "train.py"]; a string such as "uv run train.py" is split like a shell would
    command: list[str] = Field(default_factory=default_command, min_length=1)
    cwd: Path                          # the workspace (git work tree)
    env: dict[str, str] = Field(default_factory=dict)  # merged over os.environ (AUTOLOOP_* contract)
    log_path: Path                     # results/runs/<trial>-<attempt>.log, streamed as it comes
    result_path: Path | None = None    # where autoloop.evaluate writes the result JSON (AUTOLOOP_RESULT)
    budget_s: float = 300.0
    timeout_s: float | None = None     # None -> default_timeout(budget_s)
    metric: str = "val_bpb"
    name: str | None = None            # what the run is called where it runs (a Slurm job's name)
    max_rss_gb: float | None = None    # kill the tree when its total RSS crosses this (GiB)
    grace_s: float = 5.0               # SIGTERM -> SIGKILL grace period
    sample_interval_s: float = 0.25    # psutil sampling period
    # True for train.py under the harness: a metric only on stdout (the result file of
    # autoloop.evaluate missing) is then refused, since stdout is whatever train.py prints.
    require_result: bool = False
    # A file fed to the command's stdin (an agent's prompt); None -> /dev/null, as for trials.
    stdin_path: Path | None = None
    # Keep the log under this size: its first and last halves around a line saying what was
    # cut (None or 0: no cap). The tail is what classification and fix requests read.
    log_cap_bytes: int | None = Field(default=None, ge=0)
    # Run the command in a network namespace of its own: no network (autoloop.execution.isolate).
    isolate: bool = False

    @field_validator("command", mode="before")
    @classmethod
    def _split_command(cls, value: object) -> object:
        return shlex.split(value) if isinstance(value, str) else value


class RunOutcome(BaseModel):
    """How one run ended: its exit, a kill and why, its metric (or why there is none), its peaks."""

    exit_code: int | None = None       # None when killed by a signal
    signal: int | None = None          # signal number that ended the main process
    timed_out: bool = False
    killed_reason: str | None = None   # "timeout" | "max_rss" | "stopped" (stop_event set) | None
    max_rss_gb: float | None = None    # the cap that was in force (for the reason text)
    metric_name: str = "val_bpb"
    metric: float | None = None        # finite, validated metric; None when missing or invalid
    metric_error: str | None = None    # why the metric is unusable ("val_bpb is nan", disagreement...)
    summary: dict[str, float] = Field(default_factory=dict)  # parsed '---' summary block fields
    result: dict[str, Any] | None = None         # the result JSON as written by autoloop.evaluate
    peak_rss_mb: float = 0.0           # peak resident memory of the whole process tree
    wall_seconds: float = 0.0
    log_path: Path
    log_tail: str = ""                 # last lines of the log (for classification and fix requests)
    started_at: float = 0.0
    ended_at: float = 0.0
    timeout_s: float | None = None     # the hard limit that was in force (for the reason text)
    launch_error: str | None = None    # the command could not start ("command not found: uv")
    last_progress: str | None = None   # the last "step ..." line seen
    leftover_processes: int = 0        # descendants still alive after the main process ended, killed
    log_cut_bytes: int = 0             # output cut from the middle of the log by its cap
    # Executor slurm (autoloop.execution.executors): the job that ran the trial (executor, cluster,
    # job_id; copied into the ledger record's extra), and why it gave no normal outcome
    # (cancelled by the scheduler, its node died, ...).
    job: dict[str, Any] = Field(default_factory=dict)
    # The cluster ended the trial and kept ending it past the executor's retries (preempted, its
    # node failed, lost, past the queue's limit): why, in one line. It says nothing of the change:
    # the attempt is recorded as ``ended``, never a crash (engine/attempt.py).
    cluster_ended: str | None = None
    job_error: str | None = None


def _format_seconds(seconds: float) -> str:
    # train.py parses it with float(); keep integers integral ("300", not "300.0").
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


def build_env(budget_s: float, seed: int, result_path: Path | None, data_dir: Path | None = None,
              device: str | None = None, nonce: str | None = None,
              harness_path: Path | None = None) -> dict[str, str]:
    """The AUTOLOOP_* environment of the harness -> train.py contract.

    Unset optional values are left out, so train.py's own defaults (or the caller's
    environment) apply. PYTHONUNBUFFERED makes the log stream as the trial runs.
    ``harness_path`` goes first on PYTHONPATH: the folder holding the private copy of the
    harness that the trial imports (integrity.copy_harness).
    """
    if budget_s <= 0:
        raise ValueError(f"budget must be positive, got {budget_s} s")
    env = {"AUTOLOOP_BUDGET_S": _format_seconds(budget_s), "AUTOLOOP_SEED": str(int(seed)),
           "PYTHONUNBUFFERED": "1"}
    optional = {"AUTOLOOP_RESULT": result_path, "AUTOLOOP_DATA_DIR": data_dir,
                "AUTOLOOP_DEVICE": device, "AUTOLOOP_NONCE": nonce}
    env.update({key: str(value) for key, value in optional.items() if value})
    if harness_path is not None:
        inherited = os.environ.get("PYTHONPATH")
        env["PYTHONPATH"] = str(harness_path) + (os.pathsep + inherited if inherited else "")
    return env


class _Reader(threading.Thread):
    """Drains the trial's merged output into the log, keeping a bounded tail and the latest
    progress and metric lines. Never blocks the runner: a flood only costs this thread."""

    def __init__(self, fd: int, log: RunLog, metric: str, on_progress: Callable[[str], None] | None,
                 on_output: Callable[[bytes], None] | None = None):
        super().__init__(name="autoloop-trial-reader", daemon=True)
        self._fd = fd
        self._log = log
        self._on_progress = on_progress
        self._progress_failed = False
        self._on_output = on_output   # every chunk, for the agent proposer's output watch (agent_watch.py)
        self._metric_key = metric.encode() + b":"
        self._metric_re = re.compile(_LINE_START + re.escape(self._metric_key) + rb"[ \t]*(" + _NUMBER + rb")",
                                     re.IGNORECASE)
        self._tail = bytearray()
        self._carry = b""          # an incomplete last line, joined with the next read
        self._skipping = False     # inside a line longer than MAX_LINE: ignore until its end
        self.metric_text: str | None = None   # the number on the last "<metric>: <number>" line
        self.last_progress: str | None = None
        # Set by the runner when a process outside its reach keeps the pipe open.
        self.give_up_at: float | None = None

    def run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN | select.POLLHUP)
        while self.give_up_at is None or time.monotonic() < self.give_up_at:
            if not poller.poll(250):
                continue
            data = os.read(self._fd, READ_CHUNK)
            if not data:
                break
            self._log.write(data)
            if self._on_output is not None:
                self._report_output(data)
            self._tail += data
            if len(self._tail) > 2 * TAIL_BYTES:  # trim in batches: amortised O(1) per byte
                del self._tail[:-TAIL_BYTES]
            self._scan(data)
        if self._carry:  # a last line without a newline still counts
            self._scan(b"\n")

    def _scan(self, data: bytes) -> None:
        if self._skipping:
            eol = _EOL_RE.search(data)
            if eol is None:
                return
            data, self._skipping = data[eol.end():], False
        buf = self._carry + data
        end = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1
        lines, self._carry = buf[:end], buf[end:]
        if len(self._carry) > MAX_LINE:
            self._carry, self._skipping = b"", True
        if PROGRESS_PREFIX in lines:
            progress = _last_match(PROGRESS_RE, lines)
            if progress is not None:
                self._report_progress(progress.group().decode(errors="replace").strip())
        if self._metric_key in lines:
            found = _last_match(self._metric_re, lines)
            if found is not None:
                self.metric_text = found.group(1).decode()

    def _report_progress(self, line: str) -> None:
        self.last_progress = line
        if self._on_progress is None:
            return
        try:
            self._on_progress(line)
        except Exception:  # a display bug must not end the night's run
            if not self._progress_failed:
                logger.exception("on_progress callback failed; further failures are not logged")
            self._progress_failed = True

    def _report_output(self, data: bytes) -> None:
        watch = self._on_output
        if watch is None:
            return
        try:
            watch(data)
        except Exception:  # a watcher's bug must not stop the draining
            logger.exception("on_output callback failed; no more output is given to it")
            self._on_output = None

    def tail(self) -> str:
        data = bytes(self._tail[-TAIL_BYTES:])
        if len(self._tail) > TAIL_BYTES:  # the first line was cut: drop the fragment
            data = data[data.find(b"\n") + 1:]
        text = data.decode("utf-8", errors="replace").replace("\r\n", "\n")
        return "\n".join(text.splitlines()[-TAIL_LINES:])


def _last_match(pattern: re.Pattern[bytes], data: bytes) -> re.Match[bytes] | None:
    last = None
    for found in pattern.finditer(data):
        last = found
    return last


# ---------------------------------------------------------------------------------
# Waiting for the main process.


class _ExitWatch:
    """Sleeps until the main process exits or a timeout passes. A pidfd (Linux) wakes at the
    exit itself; elsewhere Popen.wait polls, up to 50 ms late."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self._proc = proc
        self._fd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self._fd = os.pidfd_open(proc.pid)
            self._poller = select.poll()
            self._poller.register(self._fd, select.POLLIN)

    def wait(self, timeout_s: float) -> None:
        if self._fd is not None:
            self._poller.poll(timeout_s * 1000)
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=timeout_s)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)


# ---------------------------------------------------------------------------------
# Reading the metric and the summary block.


def _parse_summary(tail: str) -> dict[str, float]:
    """The ``key: number`` lines of the tail, the last of each name winning, so the block
    after the last ``---`` line decides. Lines before it count too: a foreign command's
    ``NAME: value`` lines need no block (guards and the morning's trade-offs read them)."""
    lines = tail.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == "---"]
    summary = {}
    for line in lines:
        found = _SUMMARY_LINE_RE.match(line.strip())
        if found:
            summary[found.group(1)] = float(found.group(2))
    for line in lines[starts[-1] + 1:] if starts else ():
        found = _SUMMARY_LINE_RE.match(line.strip())
        if found:
            summary[found.group(1)] = float(found.group(2))
    return summary


def _print_tolerance(text: str) -> float:
    """Half a unit in the last printed digit: how far a correctly printed number may be off."""
    try:
        exponent = Decimal(text).as_tuple().exponent
    except InvalidOperation:
        return 0.0
    return 0.5 * 10.0 ** exponent if isinstance(exponent, int) else 0.0


def _read_metric(spec: RunSpec, result_path: Path | None, nonce: str | None,
                 stdout_text: str | None) -> tuple[float | None, str | None, dict[str, Any] | None]:
    """(metric, metric_error, result record): the result file first, stdout as the fallback,
    and a number only when it is finite and both sources agree."""
    name = spec.metric
    stdout_value = float(stdout_text) if stdout_text is not None else None
    if result_path is None or not result_path.exists():
        if stdout_value is None:
            # Nothing reported at all (an edit that skips the evaluation, an early exit 0):
            # a bug of the edit, which a fix request can mend (classify: trivial).
            return None, None, None
        if spec.require_result:
            # A number on stdout that autoloop.evaluate never wrote cannot be trusted.
            return None, f"no result file from autoloop.evaluate ({result_path}) for the {name} on stdout", None
        if not math.isfinite(stdout_value):
            return None, f"{name} is {stdout_value}", None
        return stdout_value, None, None
    try:
        result = json.loads(result_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"result file unreadable: {exc}", None
    if not isinstance(result, dict):
        return None, "result file unreadable: not a JSON object", None
    # Missing and wrong nonces are told apart: a result file without one was not written by
    # autoloop.evaluate under this harness; one with another nonce is another trial's.
    if nonce and not result.get("nonce"):
        return None, "result file has no nonce (not written for this trial by autoloop.evaluate)", result
    if nonce and result.get("nonce") != nonce:
        return None, "result nonce mismatch (the result file belongs to another trial)", result
    value = result.get(name, result.get("value") if result.get("metric") == name else None)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, f"result file has no numeric {name}", result
    value = float(value)
    if not math.isfinite(value):
        return None, f"{name} is {value}", result
    if stdout_text is not None and stdout_value is not None:
        tolerance = _print_tolerance(stdout_text) + 1e-9 * abs(value)
        if not abs(stdout_value - value) <= tolerance:  # also true for a nan on stdout
            return None, f"result file {name} {value:.6f} disagrees with stdout {stdout_text}", result
    return value, None, result


# ---------------------------------------------------------------------------------
# One trial.


def _child_env(spec: RunSpec, result_path: Path | None, token: str) -> dict[str, str]:
    env = {**os.environ, **spec.env, TOKEN_VAR: token, "PYTHONUNBUFFERED": "1"}
    env.setdefault("PYTHONFAULTHANDLER", "1")
    if spec.timeout_s is not None:   # the limit in force: train.py sets its ranks' collective timeout below it
        env["AUTOLOOP_TIMEOUT_S"] = _format_seconds(spec.timeout_s)
    if result_path is None:
        env.pop("AUTOLOOP_RESULT", None)
    else:
        env["AUTOLOOP_RESULT"] = str(result_path)
    return env


def _preexec(group: RunGroup | None, isolate: bool) -> Callable[[], None] | None:
    """What the child does between fork and exec: join the run's cgroup (before it can fork
    anything), enter a network namespace of its own (--isolate)."""
    if group is None and not isolate:
        return None

    def in_child() -> None:
        if group is not None:
            group.join()
        if isolate:
            enter_network_namespace()
    return in_child


def _launch_failure(spec: RunSpec, log: RunLog, timeout_s: float, exit_code: int, error: str,
                    group: RunGroup | None = None) -> RunOutcome:
    if group is not None:
        group.end()
    log.note(error)
    log.close()
    now = time.time()
    return RunOutcome(exit_code=exit_code, launch_error=error, metric_name=spec.metric,
                        max_rss_gb=spec.max_rss_gb, timeout_s=timeout_s, log_path=spec.log_path,
                        log_tail=log.notes[-1], started_at=now, ended_at=now)


def _supervise(proc: subprocess.Popen[bytes], tree: ProcessTree, log: RunLog, spec: RunSpec, deadline: float,
               stop_event: StopSignal | None) -> tuple[str | None, int]:
    """Sample the tree until the main process exits or a limit ends it:
    (killed_reason, peak RSS of the tree in bytes)."""
    cap_bytes = spec.max_rss_gb * 2**30 if spec.max_rss_gb else None
    peak = 0
    exit_watch = _ExitWatch(proc)
    try:
        while proc.poll() is None:
            # RSS counts pages shared by forked workers once per process: an overestimate,
            # which is the safe side for a cap.
            rss = tree.rss_bytes(tree.refresh())
            peak = max(peak, rss)
            if stop_event is not None and stop_event.is_set():
                stop = ("stopped", "stop requested")
            elif time.monotonic() >= deadline:
                stop = ("timeout", f"hard timeout of {spec.timeout_s:g} s exceeded")
            elif cap_bytes is not None and rss > cap_bytes:
                stop = ("max_rss", f"memory {rss / 2**30:.2f} GiB over the cap of {spec.max_rss_gb:g} GiB")
            else:
                exit_watch.wait(max(0.0, min(spec.sample_interval_s, deadline - time.monotonic())))
                continue
            log.note(f"{stop[1]}: ending the process tree")
            tree.end(spec.grace_s)
            proc.wait()
            return stop[0], peak
        return None, peak
    finally:
        exit_watch.close()


def run_process(spec: RunSpec, on_progress: Callable[[str], None] | None = None,
              stop_event: StopSignal | None = None,
              on_start: Callable[[list[tuple[int, float]]], None] | None = None,
              on_output: Callable[[bytes], None] | None = None) -> RunOutcome:
    """Run the trial to completion, timeout, memory cap or stop_event; return only when
    nothing it started is alive.

    on_output gets every chunk of the merged output as it is read (the agent proposer's
    output watch), called from the reader thread; stop_event may be any object with
    ``is_set()`` (that watch is one).

    on_progress gets the latest "step ..." line, called from the reader thread. on_start gets
    [(pid, create_time)] of the main process once it is launched (the leader of its own
    process group and session), for recovery after the orchestrator itself dies. An exception
    in either callback is logged and otherwise ignored: the trial is already running.
    """
    timeout_s = spec.timeout_s if spec.timeout_s is not None else default_timeout(spec.budget_s)
    spec = spec.model_copy(update={"timeout_s": timeout_s})
    result_path = _fresh_result_path(spec)
    # A caller that must find the tree again after its own death (the agent proposer,
    # for recovery) chooses the token and records it first.
    token = spec.env.get(TOKEN_VAR) or uuid.uuid4().hex
    env = _child_env(spec, result_path, token)
    log = RunLog(spec.log_path, spec.log_cap_bytes)
    if not Path(spec.cwd).is_dir():
        return _launch_failure(spec, log, timeout_s, 127, f"workspace not found: {spec.cwd}")

    group = RunGroup.open(token)   # None where the machine has no cgroup for us
    with adopting_orphans():
        started_at, t0 = time.time(), time.monotonic()
        launched = _launch(spec, env, group, log, timeout_s)
        if isinstance(launched, RunOutcome):
            return launched
        proc = launched
        reader = _Reader(_pipe(proc).fileno(), log, spec.metric, on_progress, on_output)
        reader.start()
        tree = ProcessTree(proc, token, group)
        if on_start is not None:
            try:
                on_start(tree.members())
            except Exception:  # see the docstring
                logger.exception("on_start callback failed")
        killed_reason, peak = _supervise(proc, tree, log, spec, t0 + timeout_s, stop_event)
        ran = _Ran(killed_reason, peak, started_at, time.monotonic() - t0, _end_the_rest(tree, group, log, spec))
    _drain(reader, proc, log)
    return _finished(spec, proc, reader, log, result_path, env.get("AUTOLOOP_NONCE"), ran)


def _fresh_result_path(spec: RunSpec) -> Path | None:
    """Where the trial writes its result (absolute), with any stale one removed: a stale
    result must never be read as this trial's."""
    result_path = spec.result_path or (Path(spec.env["AUTOLOOP_RESULT"]) if spec.env.get("AUTOLOOP_RESULT") else None)
    if result_path is not None:
        result_path = Path(spec.cwd, result_path).absolute()
        result_path.unlink(missing_ok=True)
    return result_path


def _launch(spec: RunSpec, env: dict[str, str], group: RunGroup | None, log: RunLog,
            timeout_s: float) -> subprocess.Popen[bytes] | RunOutcome:
    """The trial's main process, started; or the outcome of a launch that failed."""
    program = spec.command[0]
    stdin = open(spec.stdin_path, "rb") if spec.stdin_path is not None else None
    try:
        # preexec_fn runs between fork and exec; it is unsafe with threads because
        # the child may need a lock another thread held at the fork. Joining the cgroup is
        # one os.write, the isolation code takes none (see autoloop.execution.isolate); with neither
        # there is no preexec_fn.
        return subprocess.Popen(spec.command, cwd=spec.cwd, env=env,
                                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_preexec(group, spec.isolate))
    except FileNotFoundError:
        return _launch_failure(spec, log, timeout_s, 127, f"command not found: {program}", group)
    except PermissionError:
        return _launch_failure(spec, log, timeout_s, 126, f"command not executable: {program}", group)
    except OSError as exc:
        return _launch_failure(spec, log, timeout_s, 126, f"cannot start {program}: {exc.strerror or exc}", group)
    except subprocess.SubprocessError:  # only preexec_fn raises it: the namespace was refused
        why = isolation_available()[1] or "the kernel refused it"
        return _launch_failure(spec, log, timeout_s, 126,
                               f"--isolate: cannot enter a network namespace ({why})", group)
    finally:
        if stdin is not None:
            stdin.close()  # the child has its own copy of the descriptor


def _pipe(proc: subprocess.Popen[bytes]) -> IO[bytes]:
    """The main process's merged output: a pipe, as _launch asked (stdout=PIPE)."""
    if proc.stdout is None:
        raise RuntimeError("the trial's output is not a pipe")
    return proc.stdout


def _end_the_rest(tree: ProcessTree, group: RunGroup | None, log: RunLog, spec: RunSpec) -> int:
    """After the main process: end whatever of the run outlived it; how many processes."""
    leftovers = tree.end(spec.grace_s)  # daemons, workers: anything that outlived the main process
    if leftovers:
        log.note(f"killed {leftovers} process(es) still running after the main process ended")
    escaped = group.end() if group is not None else 0   # the run is over: nothing of it stays
    if escaped:
        log.note(f"killed {escaped} process(es) that had escaped the process tree (found in the run's cgroup)")
        leftovers += escaped
    return leftovers


def _drain(reader: _Reader, proc: subprocess.Popen[bytes], log: RunLog) -> None:
    """Let the reader take the rest of the output, then close the pipe and the log."""
    reader.join(timeout=2.0)
    if reader.is_alive():  # only a process beyond reach (cleared env, other session) holds the pipe
        log.note("output pipe held open by an escaped process; stopped reading")
        reader.give_up_at = time.monotonic()
        reader.join()
    _pipe(proc).close()
    log.close()


@dataclass(frozen=True)
class _Ran:
    """How the main process's run went, as run_process saw it."""

    killed_reason: str | None
    peak_bytes: int          # peak resident memory of the tree
    started_at: float
    wall_seconds: float
    leftovers: int           # processes ended after the main process


def _finished(spec: RunSpec, proc: subprocess.Popen[bytes], reader: _Reader, log: RunLog,
              result_path: Path | None, nonce: str | None, ran: _Ran) -> RunOutcome:
    tail = "\n".join(filter(None, [reader.tail(), *log.notes]))
    metric, metric_error, result = _read_metric(spec, result_path, nonce, reader.metric_text)
    code = proc.returncode
    return RunOutcome(
        exit_code=code if code >= 0 else None, signal=-code if code < 0 else None,
        timed_out=ran.killed_reason == "timeout", killed_reason=ran.killed_reason, max_rss_gb=spec.max_rss_gb,
        metric_name=spec.metric, metric=metric, metric_error=metric_error, summary=_parse_summary(tail),
        result=result, peak_rss_mb=ran.peak_bytes / 2**20, wall_seconds=ran.wall_seconds, log_path=spec.log_path,
        log_tail=tail, started_at=ran.started_at, ended_at=time.time(), timeout_s=spec.timeout_s,
        last_progress=reader.last_progress, leftover_processes=ran.leftovers, log_cut_bytes=log.cut_bytes,
    )
