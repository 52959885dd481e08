"""Search warm-started from earlier nights: what the mutator and Optuna are told of them.

A second night on the same problem should not start its search cold. The engine reads the
earlier *comparable* nights once at the start (engine/study.py) and hands the proposers
their measured points as :class:`EarlierPoint` (``ProposalRequest.earlier``); ``--no-warm-start``
hands none.

Values are *re-based*: an earlier night's numbers were measured against its own baseline,
and this night may start from somewhere else (``run --from TAG`` starts on its final best;
a machine's drift moves every number a little). Each point carries its night's *anchor*,
that night's value of the code this night started from (its best when this night starts on
its final branch, its baseline when both started from the same commit, else its baseline);
:func:`rebased` shifts a point by this night's baseline minus that anchor, so a point is
told to Optuna as what it would read tonight.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EarlierPoint:
    """One measured trial of an earlier comparable night."""

    tag: str
    trial: int
    description: str
    status: str                 # keep, discard or crash
    value: float | None         # as measured then (None: it crashed)
    anchor: float | None        # that night's value of the code this night started from
    source: str | None          # the target at its commit (None: git no longer has it)
    parent_code: str            # duplicate_gate.code_key of the target it was built on

    @property
    def label(self) -> str:
        return f"{self.tag} #{self.trial}"


def rebased(point: EarlierPoint, baseline: float | None) -> float | None:
    """The point's value shifted to this night's scale (``baseline``: this night's)."""
    if point.value is None:
        return None
    if baseline is None or point.anchor is None:
        return point.value
    return point.value + (baseline - point.anchor)
