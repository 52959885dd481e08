"""An external coding agent as the proposer: one run of its command per proposal.

Each call writes the prompt (program.md, then the request: best so far, the research
digest of the whole night (digest.py), and for a fix request the crash and the end of
its log) to
``results/agents/<trial>-<attempt>.prompt.md`` and runs the agent's command in the
workspace with that prompt on stdin. The command is split like a shell would split it but
run without one; these placeholders are replaced in its arguments:

    {prompt_file}       the prompt file (absolute path)
    {description_file}  where the agent may write its one-line description
    {hypothesis_file}   where the agent may write its one-line hypothesis (why it should help)
    {target}            the file to edit, relative to the workspace (train.py)
    {workspace}         the workspace root
    {results_dir}       the results folder (ignored by git: safe for an agent's own files)

and the environment carries AUTOLOOP_PROMPT_FILE, AUTOLOOP_DESCRIPTION_FILE,
AUTOLOOP_HYPOTHESIS_FILE, AUTOLOOP_TARGET, AUTOLOOP_TRIAL and AUTOLOOP_ATTEMPT. The
hypothesis, when written, goes into the proposal's extra (``hypothesis``): the ledger,
results.tsv's last column, the report and the digest show it. For pipes or redirections, wrap
the command in ``sh -c '...'`` and use the variables.

The agent's output (stdout and stderr) goes to ``results/agents/<trial>-<attempt>.log``.
The run is supervised by the trial runner: its own session, a timeout that ends the
whole process tree, the loop's Ctrl-C. For a known CLI (presets.py, also behind a
--agent-cmd that runs one) its output is watched as it comes (agent_watch.py): a line
meaning the call cannot succeed ends it at once, and so does a CLI that only keeps
retrying its API. A run that fails, is ended so, times out or leaves the target
unchanged raises ProposalFailed with a reason quoting the CLI (the loop records a `skip`
and counts it towards ``max_agent_failures``); changes outside the target are the loop's
scope check's job. The checks before the night are preflight.py's.
"""

from __future__ import annotations

import difflib
import os
import shlex
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoloop.config.presets import PRESETS as AGENT_PRESETS
from autoloop.config.presets import Preset, preset_for
from autoloop.config.settings import Settings
from autoloop.core import module_constants
from autoloop.core.durations import format_duration
from autoloop.core.layout import RESULTS, Layout
from autoloop.execution.runner import TOKEN_VAR, RunOutcome, RunSpec, run_process
from autoloop.observe.console import plain
from autoloop.proposers.agent_watch import OutputWatch
from autoloop.proposers.base import Proposal, ProposalFailed, ProposalRequest, ProposerError
from autoloop.proposers.usage import read_usage
from autoloop.store.digest import InFlight, research_digest

LOG_TAIL_LINES = 60        # of a crashed run, in a fix request
MAX_DESCRIPTION = 200
MAX_HYPOTHESIS = 300
# A skip's reason in the ledger: room for a CLI's whole error line (gemini's untrusted-folder
# message is ~330 characters and names the variable to set at its end). Shortened only for
# display (console, report).
MAX_REASON = 500
_TEMPLATE_PROGRAM = Path(__file__).resolve().parent.parent / "templates" / "program.md"

# Known coding agents, each run headless with the prompt on stdin (presets.py: the flags,
# checked against each CLI's --help, and how each CLI's output is read). The exact commands
# are listed in docs/proposers.md; --agent-cmd runs anything else.
PRESETS: dict[str, str] = {name: preset.command for name, preset in AGENT_PRESETS.items()}


class AgentSetupError(ProposerError):
    """The agent cannot run at all (one line for the user, at start-up)."""


def agent_command(agent: str | None, agent_cmd: str | None) -> tuple[str, str]:
    """(command template, label) from the settings: --agent-cmd wins over a preset."""
    if agent_cmd:
        return agent_cmd, "--agent-cmd"
    if agent:
        if agent not in PRESETS:
            raise AgentSetupError(f"unknown agent '{agent}' (known: {', '.join(PRESETS)}; "
                                  f"or give a command with --agent-cmd)")
        return PRESETS[agent], agent
    raise AgentSetupError("no agent configured: pass --agent PRESET or --agent-cmd CMD")


def split_command(template: str) -> list[str]:
    try:
        argv = shlex.split(template)
    except ValueError as e:
        raise AgentSetupError(f"cannot split the agent command {template!r} into arguments ({e})") from None
    if not argv:
        raise AgentSetupError("the agent command is empty")
    return argv


def check_executable(argv0: str, workspace: Path, hint: str, search_path: str | None = None) -> str:
    """The resolved executable (searched on ``search_path``, default $PATH), or
    AgentSetupError naming what is missing."""
    if os.sep in argv0:
        path = Path(argv0) if Path(argv0).is_absolute() else Path(workspace) / argv0
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        if path.is_file():
            raise AgentSetupError(f"agent command not executable: {argv0} (chmod +x it)")
    else:
        found = shutil.which(argv0, path=search_path)
        if found:
            return found
    raise AgentSetupError(f"agent command not found: {argv0} ({hint})")


# ------------------------------------------------------------------------------ the prompt


def prompt_digest(request: ProposalRequest) -> str:
    """The research digest of the whole night (digest.py), bounded by --digest-kb."""
    in_flight = [InFlight(d.get("trial"), d.get("parent"), str(d.get("description") or "")) for d in request.in_flight]
    return research_digest(request.history, direction=request.direction, metric=request.metric_name,
                           notes=request.notes, in_flight=in_flight, limit=request.digest_bytes,
                           guards=request.guards, earlier=request.earlier_nights)


def build_prompt(request: ProposalRequest, description_file: Path, hypothesis_file: Path | None = None) -> str:
    program = request.program_text.strip()
    if not program and _TEMPLATE_PROGRAM.exists():
        program = _TEMPLATE_PROGRAM.read_text().strip()
    better = "lower" if request.direction == "min" else "higher"
    best = ("none yet" if request.parent_metric is None else
            f"{request.metric_name} {request.parent_metric:.6f} at commit {(request.parent or '-')[:7]}")
    parts = [
        program,
        "",
        "---",
        "",
        f"# This call: trial {request.trial}, attempt {request.attempt}",
        "",
        f"- Working directory: {request.workspace}",
        f"- File to edit: `{request.target}` (nothing else)",
        f"- Metric: `{request.metric_name}`, {better} is better",
        f"- Best so far: {best}",
        *([f"- Guards (a keep must also meet each): {'; '.join(request.guards)}"] if request.guards else []),
        "",
        prompt_digest(request),
        "",
    ]
    fix = request.fix
    if fix is None:
        parts += [
            "## Your task",
            "",
            f"Make ONE change to `{request.target}` that you expect to improve `{request.metric_name}`, "
            "different from what the digest shows was already tried. Do not commit, do not run the "
            f"full training. Then write a one-line description of the change to {description_file} "
            "(also in $AUTOLOOP_DESCRIPTION_FILE)"
            + (f", and one line on why you expect it to help (your hypothesis) to {hypothesis_file} "
               "(also in $AUTOLOOP_HYPOTHESIS_FILE)." if hypothesis_file else "."),
        ]
    else:
        parts += [
            "## Fix request",
            "",
            f"Your last change (\"{fix.description}\") crashed: {fix.crash}: {fix.reason}",
            "",
            f"The broken `{request.target}` is in the work tree. Fix the bug so that the same idea runs; "
            "do not start a different idea. Do not commit. Then write a one-line description of the "
            f"fixed change to {description_file} (also in $AUTOLOOP_DESCRIPTION_FILE).",
            "",
            "The end of the crashed run's log:",
            "",
            "```",
            "\n".join(fix.log_tail.splitlines()[-LOG_TAIL_LINES:]),
            "```",
        ]
    return "\n".join(parts) + "\n"


# ------------------------------------------------------------------------------ descriptions




def describe_change(before: str, after: str, target: str) -> str:
    """A description derived from the diff: 'LR 0.1 -> 0.2, WD 0 -> 0.01', else
    'edit train.py: +N -M lines'."""
    diff = list(difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0))
    added = sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in diff if line.startswith("-") and not line.startswith("---"))
    counts = f"edit {target}: +{added} -{removed} lines"
    old, new = module_constants.sources(before), module_constants.sources(after)
    if old is None or new is None:
        return counts
    changed = [f"{name} {old[name]} -> {new[name]}" for name in new if name in old and old[name] != new[name]]
    if not changed:
        return counts
    text = ", ".join(changed[:3]) + (f" (+{len(changed) - 3} more)" if len(changed) > 3 else "")
    # Lines changed besides the constants' own lines mean more than a retune.
    if added > len(changed) or removed > len(changed):
        text += f"; {counts}"
    return text


def read_description(path: Path, limit: int = MAX_DESCRIPTION) -> str | None:
    """The first non-blank line of a file the agent wrote (spacing collapsed, cut to
    ``limit``), or None when there is none."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        line = " ".join(line.split())
        if line:
            return line[:limit]
    return None


# ------------------------------------------------------------------------------ the proposer


@dataclass
class AgentProposer:
    """Runs `command` (a template, see the module docstring) once per proposal."""

    command: str
    timeout_s: float = 900.0
    label: str = "agent"      # preset name or '--agent-cmd', for messages
    grace_s: float = 5.0      # SIGTERM -> SIGKILL at the timeout
    log_cap_bytes: int | None = None   # the agent's log keeps head and tail, as a trial's (runlog.py)
    # What autoloop knows about the CLI (presets.py): its environment and how to read its
    # output; None for an unknown --agent-cmd. stall_s: --agent-stall-timeout (None: off).
    preset: Preset | None = None
    stall_s: float | None = None

    name = "agent"
    can_fix = True

    def propose(self, request: ProposalRequest) -> Proposal | None:
        workspace = Path(request.workspace)
        files = _call_files(request, workspace)
        target = workspace / request.target
        before = target.read_bytes() if target.exists() else None
        watch = OutputWatch(self.preset, self.stall_s, request.stop_event)
        outcome = self._call(request, workspace, files, watch)
        log = f"see {RESULTS}/{files.log_rel}"
        if outcome.launch_error:
            raise ProposalFailed(_reason(f"agent could not start: {outcome.launch_error}"))
        # The call ran: what it cost is a fact of its record whatever came of it (null:
        # the CLI's output reported nothing; usage.py).
        usage = read_usage(files.log.read_text(errors="replace")) if files.log.exists() else None
        spent = {"agent_usage": usage.as_extra() if usage else None}
        self._check_ended(outcome, watch, log, spent)
        after = target.read_bytes() if target.exists() else None
        if after == before:
            # A CLI that printed an error and exited 0 (aider after an auth error) failed.
            raise ProposalFailed(_reason(f"agent made no change to {request.target}{_evidence(watch)}", log), spent)
        description = read_description(files.description)
        derived = description is None
        if description is None:
            description = describe_change((before or b"").decode("utf-8", "replace"),
                                          (after or b"").decode("utf-8", "replace"), request.target)
            if request.fix is not None:
                description = f"{request.fix.description} (fix: {description})"
        hypothesis = read_description(files.hypothesis, MAX_HYPOTHESIS)
        return Proposal(description=description, source=files.log_rel, derived=derived,
                        extra={**spent, **({"hypothesis": hypothesis} if hypothesis else {})})

    def _call(self, request: ProposalRequest, workspace: Path, files: _CallFiles, watch: OutputWatch) -> RunOutcome:
        """Run the command once, its output read by ``watch``, under the loop's stop request."""
        values = {"prompt_file": str(files.prompt), "description_file": str(files.description),
                  "hypothesis_file": str(files.hypothesis), "target": request.target, "workspace": str(workspace),
                  "results_dir": str(files.results_dir)}
        argv = [_fill(arg, values) for arg in split_command(self.command)]
        # The preset's variables first: the loop's own (and the user's environment) win.
        env = self.preset.agent_env() if self.preset else {}
        env.update({"AUTOLOOP_PROMPT_FILE": str(files.prompt), "AUTOLOOP_DESCRIPTION_FILE": str(files.description),
                    "AUTOLOOP_HYPOTHESIS_FILE": str(files.hypothesis),
                    "AUTOLOOP_TARGET": request.target, "AUTOLOOP_TRIAL": str(request.trial),
                    "AUTOLOOP_ATTEMPT": str(request.attempt)})
        if request.process_token:
            env[TOKEN_VAR] = request.process_token
        outcome = run_process(
            RunSpec(command=argv, cwd=workspace, env=env, log_path=files.log, stdin_path=files.prompt,
                      budget_s=self.timeout_s, timeout_s=self.timeout_s, grace_s=self.grace_s,
                      log_cap_bytes=self.log_cap_bytes),
            stop_event=watch, on_start=request.on_start, on_output=watch.feed,
        )
        watch.finish()
        return outcome

    def _check_ended(self, outcome: RunOutcome, watch: OutputWatch, log: str, spent: dict[str, Any]) -> None:
        """Raise ProposalFailed, with what the call cost, when it did not end on its own with 0."""
        ended_early = watch.reason()
        if ended_early:
            raise ProposalFailed(_reason(ended_early, log), spent)
        if outcome.killed_reason == "timeout":
            raise ProposalFailed(_reason(f"agent timed out after {format_duration(self.timeout_s)} "
                                         f"(process tree killed){_evidence(watch)}", log), spent)
        if outcome.killed_reason == "stopped":
            raise ProposalFailed("agent stopped by the loop's stop request", spent)
        if outcome.signal is not None:
            raise ProposalFailed(_reason(f"agent killed by {_signal_name(outcome.signal)}", log), spent)
        if outcome.exit_code != 0:
            last = watch.explanation() or _last_line(outcome.log_tail)
            raise ProposalFailed(_reason(f"agent exited with code {outcome.exit_code}" + (f": {last}" if last else ""),
                                         log), spent)


@dataclass(frozen=True)
class _CallFiles:
    """The files of one agent call, under results/agents/."""

    results_dir: Path
    prompt: Path
    description: Path
    hypothesis: Path
    log: Path

    @property
    def log_rel(self) -> str:
        return self.log.relative_to(self.results_dir).as_posix()   # agents/<trial>-<attempt>.log


def _call_files(request: ProposalRequest, workspace: Path) -> _CallFiles:
    """The call's files, the prompt written and what an earlier call left removed."""
    layout = Layout(Path(request.results_dir)) if request.results_dir else Layout.of(workspace)
    layout.agents.mkdir(parents=True, exist_ok=True)
    prompt_file, description_file, log_path = layout.agent_files(request.trial, request.attempt)
    hypothesis_file = layout.hypothesis_file(request.trial, request.attempt)
    for stale in (description_file, hypothesis_file):   # a stale one must not describe this change
        stale.unlink(missing_ok=True)
    prompt_file.write_text(build_prompt(request, description_file, hypothesis_file))
    return _CallFiles(layout.root, prompt_file, description_file, hypothesis_file, log_path)


def _evidence(watch: OutputWatch) -> str:
    line = watch.explanation()
    return f": {line}" if line else ""


def _reason(text: str, log: str | None = None) -> str:
    """A skip reason as the ledger keeps it: one line of at most MAX_REASON characters, the
    pointer to the log always kept (the CLI's words, last in ``text``, are what is cut)."""
    suffix = f" ({log})" if log else ""
    text = " ".join(plain(text).split())
    room = MAX_REASON - len(suffix)
    return (text if len(text) <= room else text[:room - 1] + "…") + suffix


def _fill(arg: str, values: dict[str, str]) -> str:
    # Plain replacement, not str.format: braces elsewhere in a command (a JSON config,
    # a shell snippet) must pass through untouched.
    for key, value in values.items():
        arg = arg.replace("{" + key + "}", value)
    return arg


def _last_line(tail: str) -> str:
    for line in reversed(tail.splitlines()):
        line = plain(line).strip()
        if line:
            return line
    return ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def make_agent_proposer(settings: Settings, workspace: Path) -> tuple[AgentProposer, str]:
    """The agent the settings ask for, checked now (a missing executable is a start-up
    error, not a failure per trial); and one line saying what runs."""
    template, label = agent_command(settings.agent, settings.agent_cmd)
    argv = split_command(template)
    hint = "check --agent-cmd" if label == "--agent-cmd" else "install it or use --agent-cmd"
    check_executable(argv[0], workspace, hint)
    cap = int(settings.log_cap_mb * 2**20) or None
    # A --agent-cmd running a known CLI (`claude -p --model opus`) is read like its preset.
    preset = AGENT_PRESETS.get(label) or preset_for(argv[0])
    return AgentProposer(command=template, timeout_s=settings.agent_timeout, label=label, log_cap_bytes=cap,
                         preset=preset, stall_s=settings.agent_stall_timeout or None), template
