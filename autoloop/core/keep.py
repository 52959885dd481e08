"""The keep decision: one pure function from what an attempt found to what the night does next.

:func:`decide` takes the facts of one finished attempt (how its run ended, its metrics, the
best it was built on, the best now, the noise estimate, the rules in force) and returns a
:class:`Decision`: the record's status, crash class and reason, the best after the
decision, and the next action of the trial:

* ``keep``     the candidate is the new best;
* ``discard``  it is not (a crash is a discard too: the trial decides on a fix request);
* ``confirm``  run the same commit again with another seed, then judge the mean (or, for a
               confirmation that asks for several runs, confirm again until the last);
* ``replay``   it beat the best it started from, but another worker moved the best
               meanwhile: merge its change onto the new best and run it there;
* ``stale``    as replay, but the change no longer merges, is already in the new best,
               or the best kept moving: recorded as a discard that says so;
* ``promote``  a scout run (kind ``scout``, --scout) close enough to the best's scout
               result: the same commit goes on to the full budget (core/scout.py).
               A scout run is never a keep: every keep is decided at the full budget.

A verification run (kind ``verify``, ``autoloop verify``) is measured, never judged: it is
a discard whose best is the best now, whatever its metric.

The rows, in the order a person would ask: is the measurement valid at all (tampered
inputs, a crash, other data)? is it the baseline or a noise sample? otherwise judge its
runs against the best it started from (``judge.judge_runs``), and if the best moved
meanwhile, turn a win into a replay or a stale. It does no I/O: git's verdict on the
merge comes in as a fact. ``tests/test_keep.py`` is its table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from autoloop.core.classify import CrashClass
from autoloop.core.guards import Guard, breaches, parse_guards
from autoloop.core.judge import Direction, Judgement, judge_metric, judge_runs, noise_estimate
from autoloop.core.machine_speed import Adjusted
from autoloop.core.power import ConfirmCount
from autoloop.core.scout import ScoutRef, judge_scout

MAX_NAMED = 3   # paths named in a tampering reason before "+N more"


def tampered_reason(paths: list[str]) -> str:
    """'tampered: program.md' or 'tampered: a, b, c, +2 more' for the ledger's reason."""
    shown = ", ".join(paths[:MAX_NAMED])
    more = len(paths) - MAX_NAMED
    return f"tampered: {shown}" + (f", +{more} more" if more > 0 else "")


Action = Literal["keep", "discard", "confirm", "replay", "stale", "promote"]
Best = tuple[str | None, float | None]   # (best commit, its metric); (None, None) before the baseline

# A winning candidate is replayed on a best that moved at most this many times; a best that
# keeps moving under it makes it stale (each replay costs a full trial).
MAX_REPLAYS = 3


class RuleSettings(Protocol):
    """The settings the keep rule reads (config's Settings has them; core may not import it)."""

    @property
    def direction(self) -> Direction: ...
    @property
    def min_delta(self) -> float: ...
    @property
    def keep_rule(self) -> str: ...
    @property
    def noise_z(self) -> float: ...
    @property
    def sanity_bound(self) -> float: ...
    @property
    def verify_power(self) -> float: ...


@dataclass(frozen=True)
class Rules:
    """The keep rule in force (from the settings)."""

    direction: Direction = "min"
    min_delta: float = 0.0
    keep_rule: str = "auto"
    noise_z: float = 2.0
    sanity_bound: float = 0.0
    guards: tuple[Guard, ...] = ()          # --guard: conditions on secondary metrics a keep must meet
    power: float | None = 0.8               # --power: a confirmation's runs are chosen for it (None: one re-run)

    @classmethod
    def of(cls, settings: RuleSettings) -> Rules:
        return cls(settings.direction, settings.min_delta, settings.keep_rule, settings.noise_z, settings.sanity_bound,
                   parse_guards(getattr(settings, "guards", None) or ()), settings.verify_power)


@dataclass(frozen=True)
class Facts:
    """Everything the decision depends on."""

    kind: str                               # baseline | candidate | fix | confirm | verify | scout
    commit: str | None
    runs: tuple[float, ...] = ()            # this commit's metrics: earlier runs first, this run last
    crash: tuple[CrashClass, str] | None = None    # (class, reason) when the run failed
    other_data: str | None = None           # why its metric was measured on other data
    tampered: tuple[str, ...] = ()          # protected inputs changed during the run
    parent: Best = (None, None)             # the best it was built on (its parent) and is judged against
    current: Best = (None, None)            # the best now: another worker may have moved it
    noise: float | None = None              # the noise estimate in force
    noise_sample: tuple[int, int] | None = None   # (k, N): a run of the best to estimate the noise
    can_confirm: bool = True                # a borderline gain may ask for a confirmation
    best_runs: int = 1                      # the runs the parent's value is the mean of
    confirmation: ConfirmCount | None = None   # a confirmation under way: the runs it asks for and why
    replays: int = 0                        # how often this trial's change was replayed already
    merge: Literal["clean", "conflict", "already_in"] | None = None   # its change onto `current`
    rules: Rules = field(default_factory=Rules)
    metrics: dict[str, float] = field(default_factory=dict)            # the NAME: value lines it printed
    baseline_metrics: dict[str, float] = field(default_factory=dict)   # the baseline's (relative guards)
    scout: ScoutRef | None = None           # kind scout: the best's scout runs and the scout noise
    adjusted: Adjusted | None = None        # runs, best and noise at the night's median machine speed
    pruned: str | None = None               # --prune stopped the run behind the best's curve: why


@dataclass(frozen=True)
class Decision:
    status: Literal["keep", "discard", "crash", "skip", "ended", "pruned"]
    action: Action
    reason: str
    best: Best                              # the best after this decision (the record's `best`)
    crash: CrashClass | None = None
    noise: float | None = None              # the noise estimate the record carries
    confidence: float | None = None         # gain over the noise, in sigma
    extra: dict[str, object] = field(default_factory=dict)   # facts for the record's extra (never control flow)
    metric_valid: bool = True               # False: the run's number cannot be trusted (tampered inputs)
    confirmation: ConfirmCount | None = None   # action confirm from power: the runs in all it asks for


def decide(f: Facts) -> Decision:
    """The one keep decision (see the module docstring for the rows)."""
    invalid = _invalid(f)
    if invalid is not None:
        return invalid
    if f.kind == "baseline":
        d = judge_metric(f.runs[-1], None, f.rules.direction, f.rules.min_delta)
        best = (f.commit, f.runs[-1]) if d.status == "keep" else (None, None)
        return Decision(d.status, d.status, d.reason, best)
    if f.kind == "verify":
        # A measurement for `autoloop verify` (verify.py): the morning's question is asked of
        # many such runs together, never of one against the best; the best does not move.
        return Decision("discard", "discard", "verification run (the best is not judged by it)", _unmoved(f))
    if f.kind == "scout":
        return _scouted(f)
    if f.noise_sample is not None:
        # A run of the best with another seed: it stays the best, its value becomes the mean
        # of its runs, and the spread of the runs is the noise estimate.
        k, n = f.noise_sample
        sigma, method = noise_estimate(list(f.runs))
        return Decision("keep", "keep", f"noise sample {k}/{n}", (f.commit, sum(f.runs) / len(f.runs)), noise=sigma,
                        extra={"noise_samples": list(f.runs), "noise_method": method})
    return _judged(f)


def skipped(reason: str, parent: Best, current: Best) -> Decision:
    """A proposal that failed before anything ran: recorded as a skip, the best unmoved."""
    return Decision("skip", "discard", reason, current if current[0] is not None else parent)


def cluster_ended(reason: str, parent: Best, current: Best) -> Decision:
    """A trial the cluster ended (preempted, its node failed, lost, past the queue's limit) and kept
    ending past the executor's retries: recorded as ``ended``, neither a crash nor a discard (it
    says nothing of the change), the best unmoved."""
    return Decision("ended", "discard", f"ended by the cluster, not by the change: {reason}",
                    current if current[0] is not None else parent)


def _unmoved(f: Facts) -> Best:
    """The best a record that changes nothing carries: the best now."""
    return f.current if f.current[0] is not None else f.parent


def _scouted(f: Facts) -> Decision:
    """A run at the scout budget: never a keep, the best unmoved. A run of the best itself
    is a sample of the rung (its reference, its noise); a candidate's is promoted to the
    full budget or scouted out (scout.judge_scout)."""
    if f.commit is not None and f.commit == f.parent[0]:
        return Decision("discard", "discard", "scout run of the best (the scout rung's reference and noise)",
                        _unmoved(f), extra={"scout_sample": True})
    v = judge_scout(f.runs[-1], f.scout or ScoutRef(), f.rules.direction)
    extra: dict[str, object] = {"scout": {"reference": v.reference, "margin": v.margin, "promoted": v.promote}}
    return Decision("discard", "promote" if v.promote else "discard", v.reason, _unmoved(f), extra=extra)


def _invalid(f: Facts) -> Decision | None:
    """A run whose number cannot be judged: its inputs were changed, it crashed, or it was
    measured on other data. The best does not move (a failed baseline sets none)."""
    best = (None, None) if f.kind == "baseline" else _unmoved(f)
    if f.tampered:
        paths = list(f.tampered)
        extra: dict[str, object] = {"tampered": paths}
        if f.crash is None and f.runs:
            extra["invalid_metric"] = f.runs[-1]
        return Decision("crash", "discard", tampered_reason(paths), best, crash="fundamental", extra=extra,
                        metric_valid=False)
    if f.pruned is not None:
        # Stopped on purpose behind the best's curve (core/prune.py): no metric, so never a
        # keep, and not a crash: its change is not blamed, nothing is sent back for a fix.
        return Decision("pruned", "discard", f"pruned: {f.pruned}", best, noise=f.noise)
    if f.crash is not None:
        return Decision("crash", "discard", f.crash[1], best, crash=f.crash[0])
    if f.other_data is not None:
        return Decision("crash", "discard", f.other_data, best, crash="fundamental")
    if not f.runs or f.runs[-1] is None or not math.isfinite(f.runs[-1]):
        return Decision("crash", "discard", "no usable metric", best, crash="fundamental")
    return None


def _judged(f: Facts) -> Decision:
    r = f.rules
    j, extra = _judge(f)
    # The count of a confirmation, chosen at its first run and carried by each run of it: every
    # record of the chain says it, the keep too (the report names a keep that got fewer than asked).
    count = j.count or f.confirmation
    if count is not None:
        extra["confirmation"] = count.as_dict()
    if r.guards:   # the guards in force, as the record states them (status and the report read them)
        extra["guards"] = [g.text for g in r.guards]
    broken = breaches(r.guards, f.metrics, f.baseline_metrics)
    if broken:
        extra["guard_breaches"] = [b.as_dict() for b in broken]
        if j.status != "discard":
            # A keep needs the metric better AND every guard holding: a win that breaks one is
            # a discard, never confirmed or replayed (another run cannot mend a guard).
            reason = "; ".join(b.reason for b in broken) + f" (metric: {j.reason})"
            return Decision("discard", "discard", reason, _unmoved(f), noise=f.noise, confidence=j.confidence,
                            extra=extra)
    now = f.current[0]
    if now is None or now == f.parent[0]:   # the best has not moved since the attempt started
        if j.status == "keep":   # the best's value stays the raw mean: the adjusted one moves with the night
            return Decision("keep", "keep", j.reason, (f.commit, sum(f.runs) / len(f.runs)), noise=f.noise,
                            confidence=j.confidence, extra=extra)
        # confirm: recorded as a discard of this run; the candidate stays checked out for the re-run.
        return Decision("discard", j.status, j.reason, _unmoved(f), noise=f.noise, confidence=j.confidence,
                        extra=extra, confirmation=count if j.status == "confirm" else None)
    current = now[:7]
    if j.status == "discard":
        return Decision("discard", "discard", f"{j.reason} (best has moved to {current} meanwhile)", f.current,
                        noise=f.noise, confidence=j.confidence, extra=extra)
    # It beat the best it started from, which is no longer the best: it must win on the new one.
    how = f"beat its start {(f.parent[0] or 'none')[:7]} ({j.reason})"
    extra["beat_start"] = f.parent[0]
    action: Action = "stale"
    if f.replays >= MAX_REPLAYS:
        reason = f"stale: {how} but the best kept moving ({MAX_REPLAYS} replays)"
    elif f.merge == "already_in":
        reason = f"stale: {how} but its change is already in the new best {current}"
    elif f.merge != "clean":
        reason = f"stale: {how} but its change conflicts with the new best {current}"
    else:
        action, reason = "replay", f"{how}; the best moved to {current}: replaying it there"
    if action == "stale":
        extra["stale"] = True
    return Decision("discard", action, reason, f.current, noise=f.noise, confidence=j.confidence, extra=extra)


def _judge(f: Facts) -> tuple[Judgement, dict[str, object]]:
    """judge_runs on the raw runs, or, when the night's machine-speed fit is used, on the
    runs and the best at the night's median speed; the raw verdict then goes into extra."""
    r, a = f.rules, f.adjusted
    planned = f.confirmation.runs if f.confirmation is not None else None
    raw = judge_runs(list(f.runs), f.parent[1], r.direction, r.min_delta, noise=f.noise, z=r.noise_z,
                     rule=r.keep_rule, can_confirm=f.can_confirm, sanity_bound=r.sanity_bound, power=r.power,
                     best_runs=f.best_runs, planned=planned)
    extra: dict[str, object] = {"runs": list(f.runs)} if len(f.runs) > 1 else {}
    if a is None or a.best is None:
        return raw, extra
    j = judge_runs(list(a.runs), a.best, r.direction, r.min_delta, noise=a.noise, z=r.noise_z,
                   rule=r.keep_rule, can_confirm=f.can_confirm, sanity_bound=r.sanity_bound, power=r.power,
                   best_runs=f.best_runs, planned=planned)
    extra["adjusted"] = {"runs": list(a.runs), "best": a.best, "noise": a.noise, "fit": a.note,
                         "raw": f"{raw.status}: {raw.reason}"}
    return replace(j, reason=f"at the night's median machine speed: {j.reason} (raw: {raw.status})"), extra
