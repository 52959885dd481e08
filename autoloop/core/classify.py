"""Crash classification: a pure, table-driven function of a trial's outcome.

``classify`` gathers the evidence of a finished trial (how it ended, the signal, the final
Python exception in its log tail) and returns the first row of ``RULES`` that matches,
with a one-line reason naming that evidence. The rows read in the order a person would:
did the harness end it (stop request, timeout, memory cap)? did it exit 0 (with a usable
metric or not)? and for a failure: the trial's own fail-fast line, device and memory
errors, the signal that killed it, and the type of the final exception.

Decisions the contracts leave open (docs/architecture.md, "Contracts"):
  * ValueError, IndexError, KeyError, AssertionError and ZeroDivisionError are trivial:
    the proposer changed one file that ran before, so such an exception is almost always
    a bug in the edit (a wrong index, a dimension assert, a bad argument), and the
    traceback is exactly what the proposer needs to fix it.
  * SIGKILL that the harness did not send is fundamental: on Linux it is almost always
    the kernel's out-of-memory killer.
  * Exit codes 129-159 from a wrapper (``uv run``, a shell) mean 128 + signal and are read
    as that signal.
  * Anything else is fundamental, "unclassified": retrying an unknown failure as if it were
    a typo would spend the night on fix attempts.
  * A trial over several ranks that torch's launcher reports failed is judged on the first
    failed rank's own evidence (autoloop.core.rank_failure): its exception and its signal,
    not the launcher's ``ChildFailedError``; the reason starts with ``rank N:``. A collective
    that timed out (NCCL's watchdog, gloo's wait) is named as such whatever the signal.
"""

from __future__ import annotations

import re
import signal as signals
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Literal, NamedTuple, Protocol

from autoloop.core.rank_failure import rank_failure

CrashClass = Literal["trivial", "fundamental", "timeout"]   # what a failed run was
Kind = Literal["ok", "trivial", "fundamental", "timeout"]

MAX_REASON = 200


class Classification(NamedTuple):
    kind: Kind
    reason: str   # one line naming the evidence, e.g. "NameError: name 'lr' is not defined"


class Outcome(Protocol):
    """What the rules read of a finished trial: the fields of execution's RunOutcome (core
    may not import it). ``job_error``, ``launch_error`` and ``timeout_s`` are read with a
    default, so an object without them still classifies."""
    exit_code: int | None
    signal: int | None
    timed_out: bool
    killed_reason: str | None
    max_rss_gb: float | None
    metric_name: str
    metric: float | None
    metric_error: str | None
    peak_rss_mb: float
    log_tail: str


def _optional(outcome: Outcome, name: str) -> str | None:
    value: str | None = getattr(outcome, name, None)
    return value


@dataclass(frozen=True)
class Evidence:
    state: str       # job | job_timeout | stopped | timeout | max_rss | launch | ok | metric_error | no_metric | failed
    signal: str      # the signal that ended the main process ("SIGSEGV"), "" when it exited
    exception: str   # the final Python exception: its line and message continuation, "" if none
    log: str         # the log tail
    fields: dict[str, str]  # values the reason templates may name
    rank: int | None = None  # the first failed rank of a multi-rank trial, None otherwise

    @property
    def error(self) -> str:
        """The final exception, or the whole tail when there is none (a C++ abort, a FAIL line)."""
        return self.exception or self.log


Matcher = Callable[[Evidence], "re.Match[str] | bool | None"]


class Rule(NamedTuple):
    match: Matcher   # evidence -> a regex match (its groups fill {m[1]}...) or a bool
    kind: Kind
    reason: str      # str.format template: {m[0]}, {m[1]}... and Evidence.fields


def _search(text: Callable[[Evidence], str], pattern: str) -> Matcher:
    compiled = re.compile(pattern, re.MULTILINE)

    def match(evidence: Evidence) -> re.Match[str] | None:
        last = None
        for found in compiled.finditer(text(evidence)):  # the last occurrence is the latest evidence
            last = found
        return last

    return match


def state(name: str) -> Matcher:
    return lambda evidence: evidence.state == name


def exception(pattern: str) -> Matcher:
    """Regex on the final exception (its first line is the type and message)."""
    return _search(lambda evidence: evidence.exception, pattern)


def error(pattern: str) -> Matcher:
    """Regex on the final exception, or on the whole tail when there is none."""
    return _search(lambda evidence: evidence.error, pattern)


def logged(pattern: str) -> Matcher:
    """Regex on the whole log tail (every rank's lines)."""
    return _search(lambda evidence: evidence.log, pattern)


def killed_by(pattern: str) -> Matcher:
    return _search(lambda evidence: evidence.signal, pattern)


def always(evidence: Evidence) -> bool:
    return True


def exception_type(*names: str) -> Matcher:
    """The final exception is one of these types (qualified or not: torch.OutOfMemoryError)."""
    return exception(rf"\A(?:\w+\.)*(?:{'|'.join(names)})\b")


# Shape and dtype mismatches, worded as torch (ATen, einops, dynamo) words them.
SHAPE_MISMATCH = "|".join([
    r"mat1 and mat2 shapes cannot be multiplied",
    r"The size of tensor a \(\d+\) must match the size of tensor b",
    r"shape '\[[^\]]*\]' is invalid for input of size",
    r"a and b must have same reduction dim",
    r"Sizes of tensors must match",
    r"size mismatch",
    r"[Dd]imension out of range",
    r"view size is not compatible with input tensor's size and stride",
    r"number of dims don't match",
    r"expected scalar type \w+ but found \w+",
    r"Expected all tensors to be on the same device",
    r"Expected\b.*\bgot\b",
    r"EinopsError",
])

RULES: list[Rule] = [
    # The scheduler ended the job that ran it, or the job died (executor slurm).
    Rule(state("job_timeout"), "timeout", "{job_error}"),
    Rule(state("job"), "fundamental", "{job_error}"),
    # The harness ended it.
    Rule(state("stopped"), "fundamental", "interrupted"),
    Rule(state("timeout"), "timeout", "hard timeout {timeout} exceeded"),
    Rule(state("max_rss"), "fundamental", "host memory cap {cap} GiB exceeded (peak {peak} GiB)"),
    Rule(state("launch"), "fundamental", "{launch_error}"),
    # It exited 0: the metric decides.
    Rule(state("metric_error"), "fundamental", "{metric_error}"),
    Rule(state("no_metric"), "trivial", "no {metric_name} reported"),
    Rule(state("ok"), "ok", "{metric_name} {metric}"),
    # It failed, and the idea is to blame: diverged, or too big for the machine.
    Rule(error(r"^FAIL: .+$"), "fundamental", "{m[0]}"),  # train.py's own verdict: NaN, exploding loss
    Rule(error(r"CUDA out of memory\. Tried to allocate (\S+ \w+)"), "fundamental",
         "CUDA out of memory (tried to allocate {m[1]}){at}"),
    Rule(error(r"CUDA out of memory|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED"), "fundamental",
         "CUDA out of memory{at}"),
    Rule(error(r"MPS backend out of memory"), "fundamental", "MPS out of memory{at}"),
    Rule(error(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (\d+) bytes"), "fundamental",
         "host out of memory (tried to allocate {m[1]} bytes){at}"),
    Rule(exception_type("MemoryError", "OutOfMemoryError"), "fundamental", "out of memory: {exception}{at}"),
    Rule(error(r"an illegal memory access was encountered"), "fundamental",
         "CUDA error: an illegal memory access was encountered{at}"),
    Rule(error(r"device-side assert triggered"), "fundamental", "CUDA error: device-side assert triggered{at}"),
    Rule(error(r"CUDA error: (.+)"), "fundamental", "CUDA error: {m[1]}{at}"),
    # A rank stopped taking part in a collective and the others waited out the timeout.
    Rule(logged(r"Watchdog caught collective operation timeout.*?OpType=(\w+)"), "fundamental",
         "collective {m[1]} timed out (NCCL watchdog): a rank stopped taking part"),
    Rule(logged(r"Watchdog caught collective operation timeout"), "fundamental",
         "collective timed out (NCCL watchdog): a rank stopped taking part"),
    Rule(logged(r"Timed out waiting \d+ms for (?:recv|send) operation"), "fundamental",
         "collective timed out (gloo): a rank stopped taking part"),
    Rule(killed_by(r"^SIGKILL$"), "fundamental", "killed by SIGKILL (likely the host out-of-memory killer)"),
    Rule(killed_by(r"."), "fundamental", "killed by {signal}"),
    # It failed, and the edit is to blame: the traceback is what the proposer needs.
    Rule(exception_type("SyntaxError", "IndentationError", "TabError"), "trivial", "{exception}{at}"),
    Rule(exception_type("NameError", "UnboundLocalError"), "trivial", "{exception}{at}"),
    Rule(exception_type("ImportError", "ModuleNotFoundError"), "trivial", "{exception}{at}"),
    Rule(exception_type("AttributeError"), "trivial", "{exception}{at}"),
    Rule(exception_type("TypeError"), "trivial", "{exception}{at}"),
    Rule(exception(SHAPE_MISMATCH), "trivial", "shape mismatch: {exception}{at}"),
    Rule(exception_type("ValueError", "IndexError", "KeyError", "AssertionError", "ZeroDivisionError"),
         "trivial", "{exception}{at}"),
    # Nothing recognised.
    Rule(always, "fundamental", "unclassified: {last_error}"),
]


# ---------------------------------------------------------------------------------
# Reading the evidence.

_TRACEBACK_HEADER = "Traceback (most recent call last):"
_CHAINING = ("During handling of the above exception", "The above exception was the direct cause")
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)|StopIteration)"
                             r"(?::.*)?$")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+)')
_LIBRARY = re.compile(r"site-packages|dist-packages|^<|[/\\]lib[/\\]python\d")
_MESSAGE_LINES = 20   # continuation lines of a multi-line message (CUDA errors have four)
_VERDICT = re.compile(r"^FAIL: ")  # train.py's fail-fast line


def _final_exception(lines: list[str]) -> tuple[str, str]:
    """(text, location) of the last exception in the log.

    A chained traceback ends with the exception that ended the process, after the last
    "Traceback" header; its line is the first unindented exception line after the frames.
    A SyntaxError in the main script has no header, only the frame: take the last
    exception line. The location is the innermost frame outside library code. A traceback
    followed by train.py's FAIL line was printed and survived: the FAIL line is the evidence.
    """
    headers = [i for i, line in enumerate(lines) if line.rstrip().endswith(_TRACEBACK_HEADER)]
    start = headers[-1] + 1 if headers else 0
    found = [i for i in range(start, len(lines)) if _EXCEPTION_LINE.match(lines[i])]
    if not found:
        return "", ""
    at = found[0] if headers else found[-1]
    if any(map(_VERDICT.match, lines[at + 1:])):
        return "", ""
    message = [lines[at]]
    for line in lines[at + 1: at + 1 + _MESSAGE_LINES]:
        if not line.strip() or line.startswith(_CHAINING) or line.rstrip().endswith(_TRACEBACK_HEADER):
            break
        message.append(line)
    frames = [m for m in map(_FRAME.match, lines[start if headers else max(0, at - 5): at]) if m]
    ours = [m for m in frames if not _LIBRARY.search(m["file"])] or frames
    location = f" ({PurePath(ours[-1]['file']).name}:{ours[-1]['line']})" if ours else ""
    return "\n".join(message), location


def _signal_name(outcome: Outcome) -> tuple[str, str]:
    """(name, how it is shown): from the signal, or from a wrapper's exit code 128 + n."""
    number, shown = outcome.signal, ""
    code = outcome.exit_code
    if number is None and code is not None and 128 < code < 160:
        number, shown = code - 128, f" (exit {code})"
    if not number:
        return "", ""
    try:
        name = signals.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return name, name + shown


def _state(outcome: Outcome) -> str:
    if _optional(outcome, "job_error"):
        return "job_timeout" if outcome.timed_out else "job"
    if outcome.killed_reason == "stopped":
        return "stopped"
    if outcome.timed_out or outcome.killed_reason == "timeout":
        return "timeout"
    if outcome.killed_reason == "max_rss":
        return "max_rss"
    if _optional(outcome, "launch_error"):
        return "launch"
    if outcome.exit_code == 0 and outcome.signal is None:
        if outcome.metric_error:
            return "metric_error"
        return "no_metric" if outcome.metric is None else "ok"
    return "failed"


def _number(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}" if round(value, 1) == value else f"{value:g}"


def _last_error(lines: list[str], exception_text: str, exit_code: int | None) -> str:
    if exception_text:
        return exception_text.splitlines()[0]
    for line in reversed(lines):
        if line.strip() and not line.startswith("[autoloop]"):
            return line.strip()
    return f"exit code {exit_code} with no output"


def evidence_of(outcome: Outcome) -> Evidence:
    """Everything the rules read, from a RunOutcome (or any object with its fields)."""
    lines = (outcome.log_tail or "").splitlines()
    state = _state(outcome)
    failed_rank = rank_failure(outcome.log_tail or "") if state == "failed" else None
    exception_text, location = _final_exception(failed_rank.lines if failed_rank else lines)
    signal_name, signal_shown = _signal_name(outcome)
    if failed_rank is not None:
        signal_name = signal_shown = failed_rank.signal
    timeout_s: float | None = getattr(outcome, "timeout_s", None)
    fields = {
        "timeout": f"{timeout_s:g} s" if timeout_s is not None else "",
        "cap": _number(outcome.max_rss_gb),
        "peak": f"{outcome.peak_rss_mb / 1024:.2f}",
        "metric_name": outcome.metric_name,
        "metric": f"{outcome.metric:.6f}" if outcome.metric is not None else "",
        "metric_error": outcome.metric_error or "",
        "launch_error": _optional(outcome, "launch_error") or "",
        "job_error": _optional(outcome, "job_error") or "",
        "exception": exception_text.splitlines()[0] if exception_text else "",
        "at": location,
        "signal": signal_shown,
        "last_error": (_last_error(failed_rank.lines, exception_text, failed_rank.exit_code) if failed_rank
                       else _last_error(lines, exception_text, outcome.exit_code)),
    }
    return Evidence(state, signal_name, exception_text, outcome.log_tail or "", fields,
                    failed_rank.rank if failed_rank else None)


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def classify(outcome: Outcome) -> Classification:
    """From a RunOutcome (exit_code, signal, timed_out, killed_reason, metric,
    metric_error, metric_name, log_tail) to ok | trivial | fundamental | timeout."""
    evidence = evidence_of(outcome)
    rule, found = next((rule, found) for rule in RULES if (found := rule.match(evidence)))  # the last always matches
    reason = rule.reason.format(m=found, **evidence.fields)
    return Classification(rule.kind, _one_line(reason if evidence.rank is None else f"rank {evidence.rank}: {reason}"))
