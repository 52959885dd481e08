"""What Slurm says about a job, with or without job accounting.

submitit reads job states with ``sacct``, which fails on clusters without slurmdbd (accounting
off: ``Slurm accounting storage is disabled``) and then logs a warning at every poll. Here
``scontrol show job`` is asked first (slurmctld keeps a job for ``MinJobAge`` after it ends,
300 s by default, and it answers with or without accounting); ``sacct`` only where
accounting runs and scontrol no longer knows the job. The reason that goes into the ledger is
the cluster's own words: ``CANCELLED by 0`` (sacct), ``NODE_FAIL``, ``PREEMPTED``,
``TIMEOUT``, with scontrol's ``Reason`` and exit code where sacct is not there.

:class:`QuietWatcher` is a drop-in for submitit's ``SlurmJob.watcher`` that polls this way
and warns once, not at every poll, when neither tool answers.
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable

try:
    from submitit.slurm.slurm import SlurmInfoWatcher
except ImportError:   # optional dependency; only the slurm executor builds a watcher
    SlurmInfoWatcher = object  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)
TIMEOUT_S = 20
# States in which a job still holds (or waits for) the cluster.
LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
        "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD"}


def _run(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def accounting_enabled() -> bool:
    """Whether the cluster stores job accounting (sacct works): scontrol's AccountingStorageType."""
    out = _run(["scontrol", "show", "config"]) or ""
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageType":
            return value.strip() not in ("", "accounting_storage/none")
    return False


def parse_scontrol(text: str) -> dict[str, str]:
    """``scontrol show job -o``: one line of Key=Value pairs (values without spaces, except the last ones)."""
    info: dict[str, str] = {}
    for word in text.split():
        key, eq, value = word.partition("=")
        if eq and key and key[0].isupper():
            info.setdefault(key, value)
    if "JobState" in info:
        info["State"] = info["JobState"]
    return info


def parse_sacct(text: str) -> dict[str, str]:
    """``sacct -X -P -o JobID,State,Reason,ExitCode,NodeList``: the first (allocation) line."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        return {}
    names = lines[0].split("|")
    return {k: v.strip() for k, v in zip(names, lines[1].split("|"), strict=False)}


def read_job(job_id: str) -> dict[str, str]:
    """What the cluster says about one job ({} when nothing answers): State, Reason, ExitCode, NodeList."""
    out = _run(["scontrol", "show", "job", "-d", "-o", str(job_id)])   # -d: JOB_GRES names the GPU model
    info = parse_scontrol(out) if out else {}
    if accounting_enabled() and (not info or info.get("State") not in LIVE):
        # sacct says who cancelled ("CANCELLED by 1234") and knows jobs scontrol forgot.
        acct = _run(["sacct", "-X", "-P", "-o", "JobID,State,Reason,ExitCode,NodeList", "-j", str(job_id)])
        found = parse_sacct(acct) if acct else {}
        if found.get("State"):
            info = {**info, **found}
    return info


def parse_squeue(text: str) -> dict[str, dict[str, str]]:
    """``squeue -h -t all -o %i|%T|%r|%N`` lines -> {job id: State, Reason, NodeList}."""
    found: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0]:
            found[parts[0]] = {"JobId": parts[0], "State": parts[1], "Reason": parts[2], "NodeList": parts[3]}
    return found


def read_jobs(job_ids: Iterable[str]) -> dict[str, dict[str, str]] | None:
    """What slurmctld says of many jobs in one call (squeue answers for the ids it knows, live or
    ended within MinJobAge, and leaves the others out); None when squeue itself did not answer."""
    ids = sorted({str(j) for j in job_ids})
    if not ids:
        return {}
    if shutil.which("squeue") is None:
        return None   # no answer is not "forgotten": nothing may be taken for lost on it
    try:
        proc = subprocess.run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%r|%N"],
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        # Every id unknown: squeue says so and fails; anything else is squeue not answering.
        return {} if "Invalid job id" in proc.stderr else None
    return parse_squeue(proc.stdout)


def settled(job_id: str, wait_s: float = 30.0, poll_s: float = 0.5) -> dict[str, str]:
    """read_job once the job has left the live states: its result file comes while the job
    is still COMPLETING, and the reason (CANCELLED, NODE_FAIL, ...) only after; bounded by
    ``wait_s`` (KillWait and the epilog), then whatever the cluster says."""
    deadline = time.monotonic() + wait_s
    info = read_job(job_id)
    while info and base_state(info) in LIVE and time.monotonic() < deadline:
        time.sleep(poll_s)
        info = read_job(job_id)
    return info


def wait_while_live(name: str, look: Callable[[], str | None], until: float,
                    stop_event: threading.Event | None = None, on_progress: Callable[[str], None] | None = None,
                    poll_s: float = 1.0) -> bool:
    """Wait while ``look()`` says a job (or step) is live: its state in words; None once it has
    ended; "" when no tool had a word of it. True when it has ended (or the cluster, asked twice
    in a row, no longer knows it: MinJobAge passed, no accounting), False once ``until`` (a
    time.time()) passed or ``stop_event`` was set. ``on_progress`` hears "<name> <state>" at
    the first look and at each change of state."""
    said, silent = None, 0
    while True:
        state = look()
        if state is None:
            return True
        if state == "":
            silent += 1   # twice in a row, as the watcher counts a forgotten job (slurm.GONE_AFTER)
            if silent >= 2:
                return True
        else:
            silent = 0
            if state != said and on_progress is not None:
                on_progress(f"{name} {state}")
            said = state
        if time.time() >= until:
            return False
        if stop_event is not None and stop_event.wait(poll_s):
            return False
        if stop_event is None:
            time.sleep(poll_s)


def describe(info: dict[str, str]) -> str:
    """The job's end in the cluster's words, e.g. ``CANCELLED by 0``, ``NODE_FAIL (reason NodeDown)``,
    ``CANCELLED (exit 0:15)``, ``PENDING (reason Resources)``; ``UNKNOWN`` when nothing answered."""
    state = info.get("State") or "UNKNOWN"
    extra = []
    reason = info.get("Reason")
    if reason and reason not in ("None", "(null)"):
        extra.append(f"reason {reason}")
    exit_code = info.get("ExitCode")
    if exit_code and exit_code not in ("0:0",) and state not in LIVE:
        extra.append(f"exit {exit_code}")
    restarts = info.get("Restarts")
    if restarts and restarts != "0":
        extra.append(f"requeued {restarts}x")
    return f"{state} ({', '.join(extra)})" if extra else state


def placement(info: dict[str, str]) -> dict[str, str]:
    """Where the job ran: ``node`` (NodeList) and ``gpu_model`` (``JOB_GRES=gpu:a100:2`` -> ``a100``;
    left out when the GRES names no type)."""
    found: dict[str, str] = {}
    node = info.get("NodeList")
    if node and node not in ("(null)", "None"):
        found["node"] = node
    for gres in (info.get("JOB_GRES") or "").split(","):
        parts = gres.split(":")
        if parts[0] == "gpu" and len(parts) >= 3 and not parts[1].isdigit():
            found["gpu_model"] = parts[1]
            break
    return found


def base_state(info: dict[str, str]) -> str:
    """The state word alone: ``CANCELLED by 0`` -> ``CANCELLED``."""
    return (info.get("State") or "UNKNOWN").split()[0].upper()


class QuietWatcher(SlurmInfoWatcher):
    """submitit's job-state poller, shared by every job of this process (all workers): one
    squeue call per update for all their jobs, sacct only for those squeue no longer knows
    where accounting runs; quiet on errors. :meth:`streak` says for how many updates in a row a
    job has been in its state, ``MISSING`` when no tool had a word of it (slurmctld forgot it:
    MinJobAge passed, no accounting)."""

    def __init__(self, delay_s: int = 60) -> None:
        super().__init__(delay_s=delay_s)
        self._warned = False
        self._streaks: dict[str, tuple[str, int]] = {}
        self.calls = 0   # state queries made (squeue calls), for the one-call-per-update check

    def _read_all(self, job_ids: Iterable[str]) -> dict[str, dict[str, str]]:
        ids = list(job_ids)
        self.calls += 1
        listed = read_jobs(ids)
        if listed is None:   # squeue did not answer: nothing is learnt, nothing counts as missing
            return {}
        found = {job_id: {**info, "State": base_state(info)} for job_id, info in listed.items() if job_id in ids}
        for job_id in ids:
            if job_id not in found and accounting_enabled():
                info = read_job(job_id)   # sacct knows jobs slurmctld forgot
                if info:
                    found[job_id] = {**info, "State": base_state(info)}
            state = found[job_id]["State"] if job_id in found else "MISSING"
            last, n = self._streaks.get(job_id, ("", 0))
            self._streaks[job_id] = (state, n + 1 if state == last else 1)
        return found

    def streak(self, job_id: str) -> tuple[str, int]:
        """(the job's state at the last update, or MISSING; how many updates in a row found it so)."""
        return self._streaks.get(str(job_id), ("", 0))

    def update(self) -> None:
        to_check = sorted(self._registered - self._finished)
        if not to_check:
            return
        self._num_calls += 1
        found = self._read_all(to_check)
        if not found and not self._warned:
            self._warned = True   # once: a job that slurmctld forgot is normal, a flood of warnings is not
            log.warning("neither scontrol nor sacct knows jobs %s; job states come from result files only",
                        ", ".join(to_check))
        self._info_dict.update(found)
        self._last_status_check = time.time()
        for job_id in to_check:
            if self.is_done(job_id, mode="cache"):
                self._finished.add(job_id)
