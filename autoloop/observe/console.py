"""What the loop says while it runs: plain lines, plus one live line on a terminal.

Without a terminal (redirected to a file, nohup, tmux logging) only whole lines are
written, never control characters, so the log reads cleanly in the morning. Text that
comes from elsewhere (a description an agent wrote, a reason taken from a trial's log)
may carry its own carriage returns or escape sequences: :func:`plain` strips them before
anything is written, on a terminal too.

What the lines *say* is decided by the pure functions at the end (``format_verdict`` for
a finished attempt, ``live_line`` for the running one), tested without a terminal.
"""

from __future__ import annotations

import math
import re
import shutil
import sys
import threading
import time
from typing import TYPE_CHECKING, TextIO, TypedDict

from autoloop.core.durations import format_duration

if TYPE_CHECKING:
    from autoloop.store.ledger import LedgerRecord

# ANSI/VT escape sequences (CSI ..., OSC ... BEL/ST, two-character ESC x), then any other
# C0/C1 control character. Tabs and line breaks become spaces: a line is one line.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?|\x9b[0-?]*[ -/]*[@-~]")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Characters that a non-UTF-8 log (LANG=C under an old Python, a latin-1 terminal)
# cannot hold, with ASCII stand-ins.
_ASCII_STAND_INS = {"σ": "sd", "→": "->", "…": "...", "—": "-", "Δ": "d"}

CLEAR_LINE = "\r\x1b[2K"   # only ever written when live (a terminal)


def plain(text: str) -> str:
    """``text`` as one printable line: escape sequences removed, control characters
    (\\r, \\n, \\t, backspace, ...) replaced by spaces, no trailing blanks."""
    return _CONTROLS.sub(" ", _ESCAPES.sub("", text)).rstrip()


def verbatim_line(text: str) -> str:
    """One line of code or a diff, safe for a terminal: escape sequences removed and control
    characters replaced like :func:`plain`, but tabs and trailing blanks kept (a diff's
    blank context line is a single space)."""
    return _CONTROLS.sub(lambda m: m.group() if m.group() == "\t" else " ", _ESCAPES.sub("", text))


DISPLAY_REASON = 240   # a reason on the terminal (the ledger keeps up to ~500 characters)


def shorten(text: str, limit: int = DISPLAY_REASON) -> str:
    """``text`` cut to ``limit`` characters for display, its middle dropped: the start says
    what happened, the end usually where to look ("(see results/agents/3-1.log)")."""
    if len(text) <= limit:
        return text
    tail = min(60, limit // 3)
    return text[:limit - tail - 3].rstrip() + " … " + text[-tail:].lstrip()


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 time', '2 times' (words: the plural when it is not word + 's')."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def _encodable(text: str, encoding: str | None) -> str:
    if not encoding:
        return text
    try:
        text.encode(encoding)
        return text
    except (UnicodeEncodeError, LookupError):
        for char, stand_in in _ASCII_STAND_INS.items():
            text = text.replace(char, stand_in)
        return text.encode(encoding, errors="replace").decode(encoding, errors="replace")


class Console:
    def __init__(self, stream: TextIO | None = None, live: bool | None = None):
        self.stream = stream or sys.stdout
        if live is None:
            try:
                live = self.stream.isatty()
            except (AttributeError, ValueError):   # a closed or file-like stream without isatty
                live = False
        self.live = live
        # Re-entrant: the SIGINT/SIGTERM handler prints a line, and Python runs it in the main
        # thread between two bytecodes, also inside line() itself; a plain Lock deadlocked
        # there (a Ctrl-C landing as the baseline's 'training' line was written hung the night).
        self._lock = threading.RLock()
        self._live_shown = False

    def _text(self, text: str) -> str:
        return _encodable(plain(text), getattr(self.stream, "encoding", None))

    def line(self, text: str) -> None:
        """A permanent line (clears the live line first on a terminal)."""
        text = self._text(text)
        with self._lock:
            if self._live_shown:
                self.stream.write(CLEAR_LINE)
                self._live_shown = False
            self.stream.write(f"{time.strftime('%H:%M:%S')} {text}\n")
            self.stream.flush()

    def status(self, text: str) -> None:
        """The live line: redrawn in place on a terminal, dropped otherwise."""
        if not self.live:
            return
        width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
        text = self._text(text)
        with self._lock:
            self.stream.write(CLEAR_LINE + text[:width])
            self.stream.flush()
            self._live_shown = True

    def error(self, text: str) -> None:
        self.line(text)


class Prefixed:
    """A console whose every line is marked with where it comes from (a worker: ``[w1]``)."""

    def __init__(self, console: Console, prefix: str):
        self._console, self._prefix = console, prefix

    def line(self, text: str) -> None:
        self._console.line(f"{self._prefix} {text}")

    def status(self, text: str) -> None:
        self._console.status(f"{self._prefix} {text}")

    def error(self, text: str) -> None:
        self._console.error(f"{self._prefix} {text}")


# ------------------------------------------------------------------------------ what the lines say

_NUM = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf(?:inity)?)"
_LOSS_RE = re.compile(r"\bloss:\s*(" + _NUM + r")", re.IGNORECASE)
_PERCENT_RE = re.compile(r"\((\d+(?:\.\d+)?)%\)")
_STEP_RE = re.compile(r"^step\s+(\d+)")


class Progress(TypedDict, total=False):
    step: int
    percent: float
    loss: float


def parse_progress(line: str | None) -> Progress:
    """What a progress line says: ``step 00123 (41.0%) | loss: 2.3450 | ...`` ->
    ``{"step": 123, "percent": 41.0, "loss": 2.345}``; missing parts are left out."""
    out: Progress = {}
    if not line:
        return out
    if m := _STEP_RE.match(line.strip()):
        out["step"] = int(m.group(1))
    if m := _PERCENT_RE.search(line):
        out["percent"] = float(m.group(1))
    if m := _LOSS_RE.search(line):
        out["loss"] = float(m.group(1))
    return out


def whole_seconds(seconds: float | None) -> str:
    """Whole seconds, readable: 4 -> '4s', 125 -> '2m5s'."""
    if seconds is None:
        return "-"
    return format_duration(max(0, round(seconds)))


def metric_digits(delta: float | None) -> int:
    """4 decimals, 6 when the delta would round away at 4 (a tiny but real change)."""
    if delta is not None and math.isfinite(delta) and delta != 0 and abs(delta) < 0.0005:
        return 6
    return 4


def format_verdict(label: str, record: LedgerRecord, reference: float | None) -> str:
    """One line per finished attempt, e.g.

    ``#17 keep 1.0234 (-0.0041, 3.2σ) MATRIX_LR 0.04 -> 0.06``

    ``reference`` is the best metric the attempt was judged against; the σ part (|delta|
    over the noise estimate) only appears when the record carries a noise estimate.
    """
    description = record.description or "-"
    if record.status == "crash":
        return f"{label} crash ({record.crash or 'fundamental'}) {description}: {record.reason or '-'}"
    if record.status == "skip":
        return f"{label} skipped: {record.reason or description}"
    if record.status == "ended":
        return f"{label} {description}: {record.reason or 'ended by the cluster'}"
    status: str = "measured" if record.kind == "verify" else record.status   # verify.py: never judged
    if "noise_samples" in record.extra:
        # A re-run of the best for the noise estimate: the best stays, so not a "keep" (read
        # as one, a first minute of samples looked like a run of wins).
        status = "noise sample"
    if record.metric is None:
        return f"{label} {status} - {description}"
    delta = None
    if record.kind != "baseline" and reference is not None and math.isfinite(reference):
        delta = record.metric - reference
    digits = metric_digits(delta)
    detail = ""
    if delta is not None:
        parts = [f"{delta:+.{digits}f}"]
        if record.noise is not None and math.isfinite(record.noise) and record.noise > 0:
            parts.append(f"{abs(delta) / record.noise:.1f}σ")
        runs = record.extra.get("runs")
        if isinstance(runs, list) and len(runs) > 1 and reference is not None:
            # A confirmation's verdict is on the mean of its runs, not on this run alone.
            mean = sum(runs) / len(runs)
            parts.append(f"mean of {len(runs)} runs {mean:.{digits}f}, {mean - reference:+.{digits}f}")
        detail = f" ({', '.join(parts)})"
    return f"{label} {status} {record.metric:.{digits}f}{detail} {description}"


def live_line(label: str, phase: str, elapsed_s: float | None, budget_s: float | None,
              progress: str | None, best_metric: float | None, time_left_s: float | None) -> str:
    """The one live line of the running attempt, e.g.

    ``#17 training 41% of 5m, 2m3s in | loss 2.3450 | best 1.0275 | stops in 6h12m``

    The percentage is train.py's own (its timed training loop); the time "in" is wall
    time since the trial process started, start-up and compilation included.
    """
    parsed = parse_progress(progress)
    head = f"{label} {phase}"
    if "percent" in parsed and budget_s:
        head += f" {parsed['percent']:.0f}% of {whole_seconds(budget_s)}"
    elif budget_s:
        head += f" (budget {whole_seconds(budget_s)})"
    if elapsed_s is not None:
        head += f", {whole_seconds(elapsed_s)} in"
    parts = [head]
    if "loss" in parsed:
        parts.append(f"loss {parsed['loss']:.4f}")
    if best_metric is not None:
        parts.append(f"best {best_metric:.4f}")
    if time_left_s is not None:
        parts.append(f"stops in {time_left(time_left_s)}")
    return " | ".join(parts)


def time_left(seconds: float) -> str:
    """A time left: whole minutes from an hour up (6h12m), whole seconds below."""
    seconds = max(0.0, seconds)
    return whole_seconds(round(seconds / 60) * 60 if seconds >= 3600 else seconds)
