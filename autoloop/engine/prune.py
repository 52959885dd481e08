"""Pruning in the night (--prune; the rules: core/prune.py, docs/fidelity.md).

Every run's progress lines become its curve (kept in the record when --prune is set); a
candidate or a fix is watched against its parent's curve (``watch_for``), and when the rule
says so its run is stopped through its own stop signal (``RunStop``: the night's stop or
the prune, whichever comes first). Whether the rule is still on is read from the ledger, so
a resumed night prunes, or does not, as the killed one would have.
"""

from __future__ import annotations

import threading
import time

from autoloop.core.prune import Watch, rule_off
from autoloop.engine.night import Night
from autoloop.observe.console import parse_progress
from autoloop.store import prune as store_prune
from autoloop.store.ledger import LedgerRecord

# The kinds of attempt a prune may stop: a new idea or its fix. A confirmation re-run is of a
# change that already beat the best once, the baseline and the noise runs make the curve.
WATCHED = ("candidate", "fix")


class RunStop(threading.Event):
    """A run's stop signal: set by the prune, or by the night's stop (read at each look)."""

    def __init__(self, night_stop: threading.Event):
        super().__init__()
        self._night = night_stop

    def is_set(self) -> bool:
        return super().is_set() or self._night.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        # The executors wait on it between looks (Slurm's poll): in short slices, so that
        # the night's stop is seen as soon as its own.
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = 0.5 if end is None else min(0.5, end - time.monotonic())
            if left <= 0:
                return False
            super().wait(left)
        return True


def active(night: Night) -> bool:
    """--prune is set and the night's completed trials have not turned the rule off."""
    if not night.settings.prune:
        return False
    records = night.arbiter.records()
    return rule_off(store_prune.pairs(records, night.settings.budget)) is None


def watch_for(night: Night, kind: str, parent: str | None) -> Watch | None:
    """The watch over a run of this kind built on ``parent``; None when it is not to be watched
    (another kind, the rule off, no curve of the parent yet)."""
    if kind not in WATCHED or not active(night):
        return None
    ref = store_prune.reference(night.arbiter.records(), parent, night.settings.budget, night.arbiter.noise())
    return Watch(ref) if ref.curve else None


def point(line: str, budget_s: float) -> tuple[float, float, float | None] | None:
    """(elapsed training seconds, smoothed loss, step) of a progress line: train.py's
    percentage of the budget, its loss and its step count (None where the line has none);
    None for a line without a percentage and a loss."""
    p = parse_progress(line)
    if "percent" not in p or "loss" not in p:
        return None
    return p["percent"] / 100 * budget_s, p["loss"], float(p["step"]) if "step" in p else None


def say_if_turned_off(night: Night, record: LedgerRecord) -> None:
    """The one line, said when the trial that completed the deciding pair is recorded."""
    if not night.settings.prune or record.kind not in WATCHED or record.status not in ("keep", "discard"):
        return
    found = store_prune.pairs(night.arbiter.records(), night.settings.budget)
    off = rule_off(found)
    if off is not None and off.pairs == len(found):
        night.console.line(f"pruning off: the early loss stopped ranking trials as their end does "
                           f"({off.line().replace('promoted', 'completed')}); every trial trains its whole "
                           "budget from now on")
