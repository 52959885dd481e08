"""Several proposers share one night; a bandit picks who proposes each trial (``--proposer portfolio``).

``--portfolio agent,optuna,mutate`` makes the members; before each trial a Thompson-sampling
bandit draws, for every member, a plausible rate of *improvement of the best per hour of
the night it uses*, and asks the member with the highest draw. Its evidence comes from the
ledger alone (:func:`autoloop.proposers.outcomes.trial_outcomes`), so a restart recomputes
the same state, and the members share their memory the same way: the mutator never repeats
a move anyone made at a best, Optuna learns from every point measured, an agent reads them
all in its prompt.

The model, per member: keeps (trials that moved the best) arrive at a rate lambda per
second of night time, lambda ~ Gamma(1 + keeps, 1 / (b0 + seconds)), each worth the
member's mean gain per keep, shrunk towards the pooled one by one pseudo-keep. The prior
(b0) is the whole portfolio's rate, so an untried member is drawn like an average one and
explored early; a member that keeps failing to move the best is drawn less and less, but
never ruled out. Keeps, gains and seconds are discounted by half every HALF_LIFE trials, so
the bandit follows a member whose yield changes during the night. A trial's time is its
attempts plus its proposing time (an agent's minutes count), and at least one --budget: a
failed proposal costs the night a trial slot too.

Each choice and its reason are in the ledger: ``extra.portfolio`` of the trial's records
(``choice``, ``reason``, ``propose_s``), a failed proposal's skip too (its reason also says
it: ``portfolio chose agent (...); it failed after 12.3 s: ...``; ledgers from before the skip
carried extra.portfolio are read by that reason). A member with no more ideas
(the mutator at a best it has exhausted, an empty queue) passes to the next draw; when all
have none the night stops. A fix request goes back to the member that made the broken edit.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

from autoloop.proposers.base import Proposal, ProposalFailed, ProposalRequest, Proposer
from autoloop.proposers.outcomes import TrialResult, portfolio_choice, portfolio_skip_reason, trial_outcomes
from autoloop.store.ledger import Ledger

# What a member did long ago says less about what it will do next: the mutator runs out of
# moves at a best, Optuna's model converges, an agent's ideas dry up. Evidence is discounted
# by half every HALF_LIFE trials of the portfolio (discounted Thompson sampling).
HALF_LIFE = 10


@dataclass
class Arm:
    """The ledger's evidence about one member: counts as they are, and the discounted
    keeps, gain and time the bandit draws from."""

    name: str
    trials: int = 0
    keeps: int = 0
    weighted_keeps: float = 0.0
    weighted_gain: float = 0.0      # improvement of the best (>= 0)
    weighted_seconds: float = 0.0   # night time charged


def evidence(outcomes: dict[int, TrialResult], names: list[str], min_trial_s: float) -> dict[str, Arm]:
    """Each member's trials, keeps, gain and time, from the ledger's trial outcomes."""
    arms = {name: Arm(name) for name in names}
    mine = [o for o in outcomes.values() if o.proposer in arms and o.kind != "baseline"]
    for age, o in enumerate(reversed(mine)):
        arm, weight = arms[o.proposer], 0.5 ** (age / HALF_LIFE)
        arm.trials += 1
        arm.keeps += o.kept
        arm.weighted_keeps += weight * o.kept
        arm.weighted_gain += weight * o.gain
        arm.weighted_seconds += weight * max(o.seconds, min_trial_s)
    return arms


def thompson(arms: dict[str, Arm], rng: random.Random, min_trial_s: float) -> dict[str, float]:
    """One draw per member of its gain of the best per hour (keeps per hour when no member
    has kept anything yet: the gains are then all unknown alike)."""
    keeps = sum(a.weighted_keeps for a in arms.values())
    seconds = sum(a.weighted_seconds for a in arms.values())
    gain = sum(a.weighted_gain for a in arms.values())
    # Prior: one pseudo-keep in the time the portfolio takes per keep (plus one trial's time).
    b0 = (seconds + min_trial_s) / (keeps + 1)
    pooled = gain / keeps if keeps else 1.0
    draws = {}
    for name, a in arms.items():
        rate = rng.gammavariate(1 + a.weighted_keeps, 1.0 / (b0 + a.weighted_seconds))   # keeps per second
        per_keep = (a.weighted_gain + pooled) / (a.weighted_keeps + 1)
        draws[name] = rate * per_keep * 3600
    return draws


def explain(arms: dict[str, Arm], draws: dict[str, float], order: list[str]) -> str:
    """The reason of a choice: the draws in the order taken, then the evidence."""
    unit = "gain/h" if any(a.keeps for a in arms.values()) else "keeps/h"
    ranked = " > ".join(f"{n} {draws[n]:.3g}" for n in order)
    seen = ", ".join(f"{n} {a.keeps}/{a.trials}" for n, a in arms.items())
    return f"thompson draw ({unit}): {ranked}; keeps/trials so far: {seen}"


class PortfolioProposer:
    """Delegates each proposal to one member, chosen by a Thompson-sampling bandit."""

    name = "portfolio"

    def __init__(self, members: dict[str, Proposer], min_trial_s: float) -> None:
        if not members:
            raise ValueError("a portfolio needs members")
        self.members = dict(members)
        self.min_trial_s = min_trial_s
        self.can_fix = any(m.can_fix for m in self.members.values())

    def propose(self, request: ProposalRequest) -> Proposal | None:
        records = Ledger(Path(request.results_dir)).records() if request.results_dir else []
        outcomes = trial_outcomes(records, request.direction)
        if request.fix is not None:
            owner = outcomes.get(request.trial)
            member = self.members.get(owner.proposer) if owner else None
            if owner is None or member is None or not member.can_fix:
                return None
            return self._ask(owner.proposer, member, request, f"fix request for its own trial {request.trial}")
        arms = evidence(outcomes, list(self.members), self.min_trial_s)
        draws = thompson(arms, random.Random(f"autoloop-portfolio:{request.seed}:{request.trial}"), self.min_trial_s)
        order = sorted(self.members, key=lambda n: -draws[n])
        why = explain(arms, draws, order)
        passed: list[str] = []
        for name in order:
            reason = why + (f"; no more ideas from {', '.join(passed)}" if passed else "")
            proposal = self._ask(name, self.members[name], request, reason)
            if proposal is not None:
                return proposal
            passed.append(name)
        return None

    @staticmethod
    def _ask(name: str, member: Proposer, request: ProposalRequest, reason: str) -> Proposal | None:
        started = time.monotonic()
        try:
            proposal = member.propose(request)
        except ProposalFailed as e:
            seconds = time.monotonic() - started
            raise ProposalFailed(portfolio_skip_reason(name, reason, seconds, str(e)),
                                 {**e.extra, "portfolio": portfolio_choice(name, reason, round(seconds, 1))}) from None
        if proposal is not None:
            proposal.extra = {**proposal.extra,
                              "portfolio": portfolio_choice(name, reason, round(time.monotonic() - started, 3))}
        return proposal
