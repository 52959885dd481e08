"""Crash classification: a pure, table-driven function of a trial's outcome.

INTERFACE STUB - to be implemented (issue 3).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Kind = Literal["ok", "trivial", "fundamental", "timeout"]


class Classification(NamedTuple):
    kind: Kind
    reason: str   # one line naming the evidence, e.g. "NameError: name 'lr' is not defined"


def classify(outcome) -> Classification:
    """From a TrialOutcome (exit_code, signal, timed_out, killed_reason, metric,
    metric_error, metric_name, log_tail) to ok | trivial | fundamental | timeout."""
    raise NotImplementedError
