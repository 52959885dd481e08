"""Which rank of a multi-process trial failed first, and its own evidence.

A trial over N ranks runs under torch's launcher (``python -m torch.distributed.run``). When a
rank fails, the launcher ends the others and raises ``ChildFailedError`` itself, whose
traceback is the launcher's, never the trial's. Its report names the first failure::

    Root Cause (first observed failure):
    [0]:
      time      : 2026-12-02_13:15:33
      host      : localhost
      rank      : 1 (local_rank: 1)
      exitcode  : -9 (pid: 11109)  (SIGKILL)
      error_file: <N/A>
      traceback : Signal 9 (SIGKILL) received by PID 11109

With train.py's ``record`` decorator the ``traceback`` field is the rank's own Python
traceback (read from the error file the launcher gave that rank). Without it, the rank's
stderr lines in the log, which torch prefixes with ``[rank1]:``, are the evidence.
Pure text in, a value out: the classifier (autoloop.core.classify) reads it.
"""

from __future__ import annotations

import re
import signal as signals
from dataclasses import dataclass

ROOT_CAUSE = "Root Cause (first observed failure):"
_FIELD = re.compile(r"^  (\w+)\s*: ?(.*)$")
_RANK = re.compile(r"^(\d+)")
_EXIT = re.compile(r"^(-?\d+)")
_SIGNAL_TEXT = re.compile(r"^Signal \d+ \((SIG\w+)\) received")


@dataclass(frozen=True)
class RankFailure:
    rank: int
    exit_code: int | None    # the rank's exit code; negative: -signal
    signal: str              # "SIGKILL", "" when it exited
    lines: list[str]         # the rank's own traceback or stderr lines, without prefixes


def _signal_name(code: int | None, traceback: str) -> str:
    found = _SIGNAL_TEXT.match(traceback)
    if found:
        return found.group(1)
    if code is not None and code < 0:
        try:
            return signals.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return ""


def _report_fields(lines: list[str]) -> tuple[dict[str, str], list[str]]:
    """The root cause's ``key : value`` fields, and the continuation lines of its traceback."""
    fields: dict[str, str] = {}
    traceback: list[str] = []
    for line in lines:
        if line.startswith("====="):
            break
        if "traceback" in fields:
            traceback.append(line[2:] if line.startswith("  ") else line)
            continue
        found = _FIELD.match(line)
        if found:
            fields[found.group(1)] = found.group(2).rstrip()
    return fields, traceback


def rank_failure(log: str) -> RankFailure | None:
    """The first failed rank named by the launcher's last report in the log, or None."""
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == ROOT_CAUSE]
    if not starts:
        return None
    fields, more = _report_fields(lines[starts[-1] + 1:])
    rank_match = _RANK.match(fields.get("rank", ""))
    if rank_match is None:
        return None
    rank = int(rank_match.group(1))
    exit_match = _EXIT.match(fields.get("exitcode", ""))
    code = int(exit_match.group(1)) if exit_match else None
    first = fields.get("traceback", "")
    if first.startswith("Traceback (most recent call last)"):
        own = [first, *more]
    else:
        prefix = f"[rank{rank}]:"
        own = [line[len(prefix):].removeprefix(" ") for line in lines[:starts[-1]] if line.startswith(prefix)]
    return RankFailure(rank, code, _signal_name(code, first), own)
