"""Watching an agent call's output as it comes: end it early when it cannot succeed.

An agent CLI that is not logged in, refuses the folder, waits for a browser or retries a
network it does not have would otherwise hold the loop until ``--agent-timeout`` (15
minutes), five times in a row. :class:`OutputWatch` reads the call's output line by line
(the runner's ``on_output``) and trips on

* a **fatal** line of the CLI's preset (presets.py): at once, with the line as evidence;
* a **stall**: the CLI's own retry messages still coming ``stall_s`` after the first of a
  run of them (codex's endless ``Reconnecting...``). A retry that succeeds is followed
  by silence from the retry messages, so a later one starts a new run.

It stands in for the runner's stop event (``is_set``), so a tripped watch ends the whole
process tree the way Ctrl-C does. Afterwards :meth:`OutputWatch.explanation` names the
most telling line for a call that failed without tripping (an exit 0 after an auth error).
"""

from __future__ import annotations

import codecs
import json
import re
import threading
import time
from collections.abc import Callable

from autoloop.config.presets import Fatal, Preset
from autoloop.core.durations import format_duration
from autoloop.observe.console import plain

MAX_LINE = 4096     # longer lines are not messages of the CLI; not carried over
MAX_QUOTE = 400     # of a line quoted in a reason (the ledger keeps reasons up to ~500)
_EOL = re.compile(r"[\r\n]")


class OutputWatch:
    """One agent call's output against its preset; thread-safe for one feeding thread."""

    def __init__(self, preset: Preset | None, stall_s: float | None = None,
                 stop_event: threading.Event | None = None, clock: Callable[[], float] = time.monotonic):
        self.preset = preset
        self.stall_s = stall_s or None
        self._stop_event = stop_event
        self._clock = clock
        self._carry = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")   # a character split by a read
        self._retry_since: float | None = None   # the first retry message of the current run
        self._retry_last: float | None = None
        self._retry_line = ""
        self._explain_line: str | None = None
        self._lock = threading.Lock()
        self.tripped = threading.Event()
        self.fatal: Fatal | None = None          # the fatal signal seen, when one tripped the watch
        self.evidence: str | None = None         # the line that tripped it
        self.stalled_s: float | None = None      # how long the CLI had been retrying

    # -- the runner's side ---------------------------------------------------------------

    def is_set(self) -> bool:
        """The runner's stop check: the loop's stop request, or this watch tripped."""
        return self.tripped.is_set() or (self._stop_event is not None and self._stop_event.is_set())

    def feed(self, data: bytes) -> None:
        """A chunk of the call's merged output, as the runner's reader got it."""
        preset = self.preset
        if preset is None or self.tripped.is_set():
            return
        with self._lock:
            text = self._carry + self._decoder.decode(data)
            *lines, self._carry = _EOL.split(text)
            if len(self._carry) > MAX_LINE:
                self._carry = ""
            for line in lines:
                for text in self._texts(preset, plain(line[:MAX_LINE]).strip()):
                    if self._line(preset, text):
                        return

    def finish(self) -> None:
        """The output ended: a last line without a newline counts too."""
        if self._carry:
            self.feed(b"\n")

    @staticmethod
    def _texts(preset: Preset, line: str) -> list[str]:
        """The line, or for a JSON event of the CLI's (presets.JsonText) the lines of its
        message as the CLI's plain output would have printed them."""
        if not (preset.json_text and line.startswith("{")):
            return [line]
        try:
            event = json.loads(line)
        except ValueError:
            return [line]
        for spec in preset.json_text:
            if isinstance(event, dict) and event.get("type") == spec.type and isinstance(event.get(spec.field), str):
                return [spec.prefix + text.strip() for text in event[spec.field].splitlines() if text.strip()]
        return [line]

    def _line(self, preset: Preset, line: str) -> bool:
        if not line:
            return False
        for fatal in preset.fatal:
            if fatal.matches(line):
                self.fatal, self.evidence = fatal, line[:MAX_QUOTE]
                self.tripped.set()
                return True
        if any(re.match(p, line) for p in preset.retry):
            now = self._clock()
            new_run = self._retry_last is None or self.stall_s is None or now - self._retry_last > self.stall_s
            # The first retry of a new run of them starts its clock.
            since = now if new_run or self._retry_since is None else self._retry_since
            self._retry_since, self._retry_last, self._retry_line = since, now, line[:MAX_QUOTE]
            if self.stall_s is not None and now - since >= self.stall_s:
                self.stalled_s, self.evidence = now - since, self._retry_line
                self.tripped.set()
                return True
            return False
        if any(re.match(p, line) for p in preset.explain):
            self._explain_line = line[:MAX_QUOTE]
        return False

    # -- the proposer's side -------------------------------------------------------------

    def reason(self) -> str | None:
        """Why the watch ended the call, for the skip record; None when it did not."""
        if not self.tripped.is_set():
            return None
        # Only a line read against the preset trips the watch (feed): there is one.
        product = self.preset.product if self.preset is not None else "the agent"
        if self.fatal is not None:
            fix = f"; {self.fatal.fix}" if self.fatal.fix else ""
            return f"{product}: {self.fatal.meaning}{fix} (ended at once): {self.evidence}"
        return (f"{product} kept retrying for {format_duration(round(self.stalled_s or 0))} (offline, or not "
                f"logged in?), ended by --agent-stall-timeout: {self.evidence}")

    def explanation(self) -> str | None:
        """The line that best explains a failure the watch did not end: the last error the
        CLI printed, else its last retry message; None when there is neither."""
        return self._explain_line or (self._retry_line or None)
