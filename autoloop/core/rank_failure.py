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

"First observed" is not always the cause. The launcher orders failures by timestamp, and a
rank with an error file is stamped when it raised, a rank killed by a signal only when the
launcher next polls. So when rank 1 is killed and rank 0's collective fails on the broken
connection before that poll, rank 0's "Connection reset by peer" is named the root cause and
rank 1's SIGKILL is listed under "Failures:" (seen on this CPU under load; reproduced every
time with ``--monitor-interval 3``). A root cause that only says a peer went away therefore
gives way to another listed failure that is neither that nor the launcher's own SIGTERM.
Pure text in, a value out: the classifier (autoloop.core.classify) reads it.
"""

from __future__ import annotations

import re
import signal as signals
from dataclasses import dataclass

ROOT_CAUSE = "Root Cause (first observed failure):"
FAILURES = "Failures:"
_ENTRY = re.compile(r"^\[\d+\]:$")
_FIELD = re.compile(r"^  (\w+)\s*: ?(.*)$")
_RANK = re.compile(r"^(\d+)")
_EXIT = re.compile(r"^(-?\d+)")
_SIGNAL_TEXT = re.compile(r"^Signal \d+ \((SIG\w+)\) received")
# What a rank's collective raises when the rank at the other end is gone: gloo's TCP pair
# errors, NCCL's remote-error report.
_PEER_LOST = re.compile(r"Connection reset by peer|Connection closed by peer|Broken pipe|ncclRemoteError"
                        r"|remote process exited or there was a network error")


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


def _entries(lines: list[str]) -> list[tuple[dict[str, str], list[str]]]:
    """Each ``[i]:`` entry of one report section: its ``key : value`` fields and the
    continuation lines of its traceback, until the section's closing rule."""
    entries: list[tuple[dict[str, str], list[str]]] = []
    for line in lines:
        if line.startswith(("=====", "-----")):
            break
        if _ENTRY.match(line):
            entries.append(({}, []))
            continue
        if not entries:
            continue
        fields, traceback = entries[-1]
        if "traceback" in fields:
            traceback.append(line[2:] if line.startswith("  ") else line)
            continue
        found = _FIELD.match(line)
        if found:
            fields[found.group(1)] = found.group(2).rstrip()
    return entries


def _failure(fields: dict[str, str], more: list[str], log_lines: list[str]) -> RankFailure | None:
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
        own = [line[len(prefix):].removeprefix(" ") for line in log_lines if line.startswith(prefix)]
    return RankFailure(rank, code, _signal_name(code, first), own)


def _only_a_lost_peer(failure: RankFailure) -> bool:
    return any(_PEER_LOST.search(line) for line in failure.lines)


def rank_failure(log: str) -> RankFailure | None:
    """The failed rank to blame in the launcher's last report in the log, or None: its root
    cause, unless that only lost a peer and another listed rank failed on its own."""
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == ROOT_CAUSE]
    if not starts:
        return None
    before = lines[:starts[-1]]
    root_entries = _entries(lines[starts[-1] + 1:])
    root = _failure(*root_entries[0], before) if root_entries else None
    if root is None or not _only_a_lost_peer(root):
        return root
    listed = [i for i, line in enumerate(before) if line.strip() == FAILURES]
    others = [_failure(fields, more, before) for fields, more in _entries(before[listed[-1] + 1:])] if listed else []
    causes = [f for f in others if f is not None and f.signal != "SIGTERM" and not _only_a_lost_peer(f)]
    return causes[0] if causes else root
