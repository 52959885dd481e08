"""--check: commands run in the candidate's tree before it trains (tests, a lint).

Each check runs through the trial runner (``execution.runner.run_process``): its own session
and cgroup, the whole tree ended, its pids and token in the state file so that recovery
ends it after a kill. The checks and the training share the trial's one hard time limit.

A check gets the trial's environment with two differences, so that nothing it does can
stand in for the measurement: a result path of its own (``<attempt>.check.result.json``;
a check that runs train.py as a smoke test writes there, harmlessly) and no nonce (a result
it writes can never pass for the run's). What a check leaves behind is then handled like
what train.py leaves (the integrity rules):

* a file written at the trial's own result path: the attempt is invalid (``tampered``);
  nothing trains;
* the measurement's protected inputs changed (harness, program.md, data): restored, the
  attempt is invalid; nothing trains;
* files it wrote in the repository (the target included): put back before training,
  their versions quarantined, so the commit that trains is the commit that was checked.

A check exiting non-zero (or killed by the time limit) ends the attempt before training:
a ``trivial`` crash whose evidence is the check's output, the attempt's log, so the
proposer gets it back as a fix request like any trivial crash.
"""

from __future__ import annotations

import secrets
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from autoloop.config.settings import Settings
from autoloop.core.classify import Classification
from autoloop.execution.runner import TOKEN_VAR, RunOutcome, RunSpec, StopSignal, run_process
from autoloop.observe.console import Console, Prefixed
from autoloop.store.state import StateFile

MIN_TRAINING_LIMIT_S = 1.0   # what is left of the limit for training is never below this


@dataclass
class CheckContext:
    """Where the checks of one attempt run: the trial's settings, its slot's tree and state
    file, its console and the night's stop event (an AttemptRunner has them all)."""

    settings: Settings
    root: Path
    state: StateFile
    console: Console | Prefixed
    stop: StopSignal
    label: str   # the attempt's label on the console, "#3.1"


@dataclass
class CheckResult:
    """What the checks came to: ``failed`` set when training must not run."""

    failed: Classification | None = None
    outcome: RunOutcome | None = None      # the failing check's run (the record's evidence)
    tampered: list[str] = field(default_factory=list)   # paths whose change invalidates the attempt
    wrote: list[str] = field(default_factory=list)      # repository files the checks wrote, put back
    seconds: float = 0.0


def check_env(env: dict[str, str], result: Path) -> dict[str, str]:
    """The trial's environment for a check: its own result path, no nonce (module docstring)."""
    out = {k: v for k, v in env.items() if k != "AUTOLOOP_NONCE"}
    out["AUTOLOOP_RESULT"] = str(result.with_name(result.name.replace(".result.json", ".check.result.json")))
    return out


def run_checks(at: CheckContext, env: dict[str, str], result: Path, log: Path) -> CheckResult:
    """Run the night's checks in order in the slot's tree; stop at the first failure."""
    s = at.settings
    started = time.monotonic()
    for command in s.checks:
        left = s.timeout_s - (time.monotonic() - started)
        spec = RunSpec(command=shlex.split(command), cwd=at.root, env=check_env(env, result), log_path=log,
                         budget_s=s.budget, timeout_s=max(left, MIN_TRAINING_LIMIT_S), metric=s.metric,
                         max_rss_gb=s.max_rss_gb, log_cap_bytes=int(s.log_cap_mb * 2**20), isolate=s.isolate)
        spec.env[TOKEN_VAR] = secrets.token_hex(16)
        at.state.update(child_token=spec.env[TOKEN_VAR])
        at.console.line(f"{at.label} check: {command}")
        outcome = run_process(spec, stop_event=at.stop, on_start=lambda pids: at.state.update(child_pids=pids))
        failed = _failure(command, outcome)
        if failed is not None:
            return CheckResult(failed, outcome, seconds=time.monotonic() - started)
    return CheckResult(seconds=time.monotonic() - started)


def _failure(command: str, outcome: RunOutcome) -> Classification | None:
    """None when the check passed; else the attempt's crash, with the check's last words."""
    if outcome.killed_reason == "stopped":
        return Classification("fundamental", f"interrupted during --check {command!r}")
    if outcome.timed_out:
        return Classification("timeout", f"--check {command!r} ran past the trial's hard limit of "
                                         f"{outcome.timeout_s:g} s")
    if outcome.launch_error:
        return Classification("trivial", f"--check {command!r} could not start: {outcome.launch_error}")
    if outcome.exit_code == 0:
        return None
    how = f"exit {outcome.exit_code}" if outcome.exit_code is not None else f"signal {outcome.signal}"
    last = next((line.strip() for line in reversed(outcome.log_tail.splitlines()) if line.strip()), "")
    return Classification("trivial", f"check failed: {command} ({how})" + (f": {last[:200]}" if last else ""))


def training_limit(timeout_s: float, checks_seconds: float) -> float:
    """The hard limit left for training after the checks (one limit for the whole trial)."""
    return max(timeout_s - checks_seconds, MIN_TRAINING_LIMIT_S)
