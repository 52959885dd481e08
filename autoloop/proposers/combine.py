"""Recombination (``--proposer combine``, or ``combine`` in a portfolio): changes that lost
alone, tried together.

One change at a time never reaches a win that lives in an interaction: two changes that each
cost a little alone and help together are both discarded, and nothing tries them again.
Peers that recombine (autoresearch-lab's combine family, ShinkaEvolve's islands, factorial
grids) found such wins. This proposer reads its ingredients from the ledger, so a restart
sees the same ones:

* **near-misses**: changes of this night that were not kept but came within the noise of
  the best they were built on (their metric no worse than the parent's by 2 σ of the night's
  noise estimate; without an estimate, by NEAR_MISS_SHARE of the parent's metric), and those
  that beat their parent but lost to a best that moved meanwhile (another worker's keep);
* **a combination**: two ingredients applied together onto the current best, each as the
  edit from its parent's text to its commit's (``core.revert.merge3``: a three-way merge
  without context lines, by constant where the lines touch), or one ingredient alone onto a
  best that moved since it was measured. Combinations whose edits conflict, that change
  nothing, or that were tried before (their parents are in the ledger under
  ``extra.combine``) are passed over; the most promising first (the least lost, summed).

Each proposal names its parents (``extra.combine.parents``, the trials) in its record; the
report shows them beside a kept combination. Out of combinations, it has no more ideas.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from autoloop.core.revert import merge3
from autoloop.proposers.base import Proposal, ProposalRequest
from autoloop.repo.gitview import file_at
from autoloop.store import queries
from autoloop.store.ledger import LedgerRecord

# Without a noise estimate (no --noise-runs), a change that cost under this share of its
# parent's metric counts as a near-miss: the seed-to-seed spread of val_bpb at a short budget
# is of this order (docs/noise.md), so such a loss says little about the change alone.
NEAR_MISS_SHARE = 0.002
NOISE_SIGMAS = 2.0
MAX_INGREDIENTS = 12   # the most promising; pairs grow as the square


@dataclass(frozen=True)
class Ingredient:
    trial: int
    lost: float            # how much worse than its parent (negative: better), in the metric's units
    parent_text: str
    commit_text: str
    description: str
    parent: str            # the best it was measured on


def near_misses(records: list[LedgerRecord], direction: str) -> tuple[list[tuple[float, LedgerRecord]], float | None]:
    """The night's changes that were not kept but came within the noise of their parent (or
    beat it), each with how much it lost, the most promising first; and the noise estimate
    used (None: the share)."""
    night = queries.of_night(records)
    sigma = queries.noise(night)
    sign = 1.0 if direction == "min" else -1.0
    # A parent is a best: its metric is the best's after the decision that made it one.
    metric_of = {r.best: r.best_metric for r in night if r.best and r.best_metric is not None}
    found = []
    for r in night:
        parent_metric = metric_of.get(r.parent or "")
        if (r.kind != "candidate" or r.status != "discard" or r.metric is None or parent_metric is None
                or not r.commit or not r.parent or r.commit == r.parent):
            continue
        lost = sign * (r.metric - parent_metric)
        tolerance = NOISE_SIGMAS * sigma if sigma else NEAR_MISS_SHARE * abs(parent_metric)
        if lost <= tolerance:
            found.append((lost, r))
    found.sort(key=lambda pair: pair[0])
    return found, sigma


def tried(records: list[LedgerRecord]) -> set[frozenset[int]]:
    """The combinations already proposed, by their parents' trials."""
    out = set()
    for r in records:
        parents = (r.extra.get("combine") or {}).get("parents") if isinstance(r.extra, dict) else None
        if isinstance(parents, list) and all(isinstance(p, int) for p in parents):
            out.add(frozenset(parents))
    return out


class CombineProposer:
    name = "combine"
    can_fix = False

    def propose(self, request: ProposalRequest) -> Proposal | None:
        root, target = request.workspace, request.target
        path = root / target
        best_text = path.read_text()
        records = request.history
        done = tried(records)
        misses, sigma = near_misses(records, request.direction)
        ingredients = []
        for lost, r in misses[:MAX_INGREDIENTS]:
            assert r.parent is not None and r.commit is not None
            parent_text, commit_text = file_at(root, r.parent, target), file_at(root, r.commit, target)
            if parent_text is None or commit_text is None:
                continue   # the commit is gone (a repository cleaned by hand): nothing to apply
            ingredients.append(Ingredient(r.trial, lost, parent_text, commit_text,
                                          r.description.splitlines()[0] if r.description else "-", r.parent))
        for group in self._groups(ingredients, request.parent):
            key = frozenset(i.trial for i in group)
            if key in done:
                continue
            text: str | None = best_text
            for ingredient in group:
                text = merge3(ingredient.parent_text, text, ingredient.commit_text) if text is not None else None
            if text is None or text == best_text:
                continue
            path.write_text(text)
            trials = sorted(key)
            what = " + ".join(f"#{i.trial} «{i.description}»" for i in group)
            noise = f"2 σ = {NOISE_SIGMAS * sigma:.4g}" if sigma else f"{NEAR_MISS_SHARE:.1%} of its parent"
            extra: dict[str, Any] = {"combine": {"parents": trials, "lost": {str(i.trial): i.lost for i in group},
                                                 "within": noise}}
            label = "combine" if len(group) > 1 else "again on the new best"
            return Proposal(description=f"{label}: {what}", source="combine", extra=extra)
        return None

    @staticmethod
    def _groups(ingredients: list[Ingredient], best: str | None) -> list[tuple[Ingredient, ...]]:
        """Pairs, the least lost first; then one ingredient alone where the best moved since."""
        pairs = sorted(itertools.combinations(ingredients, 2), key=lambda g: sum(i.lost for i in g))
        alone = [(i,) for i in ingredients if best is not None and i.parent != best]
        return [*pairs, *alone]
