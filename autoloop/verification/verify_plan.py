"""`autoloop verify`'s plan and its verdict: the plan file, what is left to run, and the
contributions, as pure functions of the plan and the ledger (verify.py runs the plan; the
report reads the verdict from here).

The plan (``results/verify/plan.json``, written before the first run) names each variant of
the target that verification runs (the best, the baseline, the best without one kept change
or a group of them; the same at a larger scale), the trial it runs as, its commit, and the
seeds of the R repeats. A run of variant v, repeat k, is the ledger's record of kind
``verify`` in v's trial whose ``extra.verify.repeat`` is k; recovery's record of an
interrupted run carries no such key, so that run counts as not done.

How a contribution and its interval are computed, and what the verdicts mean:
``contributions.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from autoloop.core.contributions import Estimate, paired, ratio
from autoloop.core.durations import format_duration
from autoloop.core.errors import AutoloopError
from autoloop.core.layout import Layout
from autoloop.core.power import power_of, repeats_for
from autoloop.store import machine_speed, queries
from autoloop.store.atomic import atomic_write
from autoloop.store.ledger import LedgerRecord

Role = Literal["best", "baseline", "without"]
Revert = Literal["alone", "grouped", "conflict", "absent"]
VERIFY_PROPOSER = "verify"


class VerifyError(AutoloopError):
    """Verification cannot start or go on; one line for the user."""


class ChangeNote(BaseModel):
    """One kept change of the night, and how it comes out of the best."""

    trial: int
    description: str
    commit: str
    parent: str
    revert: Revert = "alone"     # alone | grouped (with the later changes on its lines) | conflict | absent
    group: list[int] = Field(default_factory=list)   # the trials taken out together with it


class Variant(BaseModel):
    """One version of the target that verification runs R times, as a trial of its own."""

    name: str                   # "best", "baseline", "without #3", "without #3+#5"; "... @scale"
    role: Role
    commit: str
    trial: int
    changes: list[int] = Field(default_factory=list)   # the trials of the kept changes taken out
    scaled: bool = False


class Plan(BaseModel):
    tag: str
    best: str
    best_metric: float | None
    baseline: str
    direction: Literal["min", "max"]
    repeats: int
    repeats_why: str = ""                       # how the count was chosen (--repeats, or from power)
    power: float | None = None                  # the power asked for (--power)
    sigma: float | None = None                  # the night's noise estimate when planned
    gains: dict[str, float] = Field(default_factory=dict)   # kept change's trial -> its claimed gain
    seeds: list[int]
    scale: dict[str, str] = Field(default_factory=dict)
    scale_budget: float | None = None
    changes: list[ChangeNote] = Field(default_factory=list)
    variants: list[Variant] = Field(default_factory=list)
    transfer_planned: bool = False
    created_at: float = 0.0

    @property
    def wants_transfer(self) -> bool:
        return bool(self.scale) or self.scale_budget is not None


# ------------------------------------------------------------------------------ the plan file


def load_plan(layout: Layout) -> Plan | None:
    path = layout.verify_plan
    if not path.exists():
        return None
    try:
        return Plan.model_validate_json(path.read_text())
    except (ValidationError, ValueError) as e:
        raise VerifyError(f"{path} cannot be read ({str(e).splitlines()[0]}); move it aside to start a new "
                          "verification") from None


def save_plan(layout: Layout, plan: Plan) -> None:
    layout.verify_plan.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(layout.verify_plan, plan.model_dump_json(indent=1) + "\n")



def variant_label(trials: list[int]) -> str:
    return "+".join(f"#{t}" for t in trials)


def scale_text(plan: Plan) -> str:
    parts = [f"{k}={v}" for k, v in plan.scale.items()]
    if plan.scale_budget is not None:
        parts.append(f"budget {format_duration(plan.scale_budget)}")
    return " ".join(parts)


# ------------------------------------------------------------------------------ what is left to run


def _is_run_of(record: LedgerRecord, variant: Variant, repeat: int) -> bool:
    info = record.extra.get("verify") or {}
    return (record.kind == "verify" and record.trial == variant.trial and info.get("repeat") == repeat
            and not queries.was_interrupted(record))


def pending(plan: Plan, records: list[LedgerRecord], scaled: bool) -> list[tuple[Variant, int]]:
    """The (variant, repeat) runs with no record yet, in the order they run: repeat by
    repeat, every variant in each (an interrupted run has no record of its own: recovery's
    says "interrupted", so it is run again; a run that crashed for real is not)."""
    ours = [r for r in records if r.kind == "verify"]
    return [(v, k) for k in range(plan.repeats) for v in plan.variants
            if v.scaled == scaled and not any(_is_run_of(r, v, k) for r in ours)]


# ------------------------------------------------------------------------------ the verdict


@dataclass(frozen=True)
class ChangeVerdict:
    trials: tuple[int, ...]
    description: str
    revert: Revert
    estimate: Estimate | None = None       # its contribution at the night's scale
    at_scale: Estimate | None = None       # at the larger scale (None: not run there)
    adjusted: Estimate | None = None       # its contribution at the median machine speed (None: not adjusted)

    @property
    def decisive(self) -> Estimate | None:
        """The estimate the verdict reads: adjusted where the night's machine-speed fit is used."""
        return self.adjusted or self.estimate

    @property
    def holds(self) -> bool | None:
        return None if self.at_scale is None else self.at_scale.verdict == "confirmed"


@dataclass(frozen=True)
class Summary:
    plan: Plan
    runs: dict[str, dict[int, float]]              # variant -> repeat -> metric
    crashed: dict[str, int]                        # variant -> runs that crashed
    gain: Estimate | None                          # best vs baseline (None: not both run yet)
    changes: list[ChangeVerdict] = field(default_factory=list)
    gain_at_scale: Estimate | None = None
    left: int = 0                                  # runs still to do
    gain_adjusted: Estimate | None = None          # the gain at the median machine speed (None: not adjusted)
    machine: str | None = None                     # the machine-speed fit's one line (None: nothing probed)

    @property
    def ratio(self) -> float | None:
        return None if self.gain_at_scale is None or self.gain is None else ratio(self.gain_at_scale, self.gain)


def summarize(plan: Plan, records: list[LedgerRecord]) -> Summary:
    """The verdict of the runs recorded so far: a pure function of the plan and the ledger."""
    runs: dict[str, dict[int, float]] = {v.name: {} for v in plan.variants}
    adjusted: dict[str, dict[int, float]] = {v.name: {} for v in plan.variants}
    crashed: dict[str, int] = {v.name: 0 for v in plan.variants}
    by_trial = {v.trial: v for v in plan.variants}
    fit = machine_speed.night_fit(records)
    for r in records:
        v = by_trial.get(r.trial)
        if v is None or r.kind != "verify" or queries.was_interrupted(r):
            continue
        repeat = (r.extra.get("verify") or {}).get("repeat")
        if r.metric is not None and r.status != "crash" and isinstance(repeat, int):
            runs[v.name][repeat] = r.metric
            adjusted[v.name][repeat] = fit.adjust(r.metric, r.machine_speed)
        elif r.status == "crash":
            crashed[v.name] += 1
    d = plan.direction

    def find(role: str, changes: list[int], scaled: bool) -> Variant | None:
        return next((v for v in plan.variants if v.role == role and v.changes == changes and v.scaled == scaled), None)

    def estimate(worse: Variant | None, better: Variant | None, of: dict[str, dict[int, float]] = runs,
                 ) -> Estimate | None:
        return None if worse is None or better is None else paired(of[worse.name], of[better.name], d)

    def adjusted_estimate(worse: Variant | None, better: Variant | None) -> Estimate | None:
        return estimate(worse, better, adjusted) if fit.use else None

    best, best_s = find("best", [], False), find("best", [], True)
    gain = estimate(find("baseline", [], False), best)
    changes, seen = [], set()
    for note in plan.changes:
        key = tuple(note.group) if note.group else (note.trial,)
        if key in seen:
            continue
        seen.add(key)
        members = [n for n in plan.changes if n.trial in key]
        description = "; ".join(n.description for n in members)
        without, without_s = find("without", list(key), False), find("without", list(key), True)
        changes.append(ChangeVerdict(key, description, note.revert, estimate(without, best),
                                     estimate(without_s, best_s), adjusted_estimate(without, best)))
    left = len(pending(plan, records, False)) + (len(pending(plan, records, True)) if plan.transfer_planned else 0)
    gain_s = estimate(find("baseline", [], True), best_s)
    probed = any(r.machine_speed is not None for r in records)
    return Summary(plan, runs, crashed, gain, changes, gain_s, left,
                   adjusted_estimate(find("baseline", [], False), best), fit.note if probed else None)


_VERDICT_WORDS = {"confirmed": "confirmed", "within noise": "within noise (unproven)", "harmful": "harmful",
                  "unproven": "unproven (too few runs)"}


def change_line(c: ChangeVerdict) -> str:
    who = variant_label(list(c.trials))
    if c.revert == "conflict":
        return f"{who} {c.description}: does not revert cleanly on the best; not measured"
    if c.revert == "absent":
        return f"{who} {c.description}: no longer in the best (a later change undid it); not measured"
    grouped = " (grouped: their edits overlap, taken out together)" if c.revert == "grouped" else ""
    est = c.estimate
    line = f"{who} {c.description}{grouped}: contribution {est.text() if est else '-'}, " \
           f"{_VERDICT_WORDS[est.verdict] if est else 'not run'}" + _adjusted_text(c.adjusted)
    if c.at_scale is not None:
        line += f"; at scale {c.at_scale.text()}, {'holds' if c.holds else 'does not hold'}"
    return line


def _adjusted_text(e: Estimate | None) -> str:
    """Beside a raw estimate: the same at the night's median machine speed, which the verdict reads."""
    return "" if e is None else f"; at the median machine speed {e.text()}, {_VERDICT_WORDS[e.verdict]}"


def summary_lines(s: Summary) -> list[str]:
    p = s.plan
    lines = [(f"verification of {p.best[:7]} against the baseline {p.baseline[:7]}: {p.repeats} repeats, "
              f"seeds {p.seeds[0]}..{p.seeds[-1]}, metric {'lower' if p.direction == 'min' else 'higher'} is better; "
              f"contribution = how much worse the best is without it (95% t-interval, paired by seed)"),
             (f"gain of the best over the baseline: {s.gain.text() if s.gain else '-'} "
              f"({_VERDICT_WORDS[s.gain.verdict] if s.gain else 'not run'})" + _adjusted_text(s.gain_adjusted))]
    if s.machine:
        lines.append(f"machine speed: {s.machine}")
    lines += ["  " + change_line(c) for c in s.changes]
    if p.transfer_planned and s.gain_at_scale is not None:
        r = s.ratio
        holds = "holds" if s.gain_at_scale.verdict == "confirmed" else "does not hold"
        lines.append(f"at scale ({scale_text(p)}): gain {s.gain_at_scale.text()}"
                     + (f", {r:.2f} x the gain at the night's scale" if r is not None else "") + f": {holds}")
    crashed = {k: n for k, n in s.crashed.items() if n}
    if crashed:
        lines.append("crashed runs (left out of the pairs): " + ", ".join(f"{k} {n}" for k, n in crashed.items()))
    weak = under_powered(p)
    if weak:
        lines.append(f"under-powered at {p.repeats} repeats (σ {p.sigma:.4g}, {p.power:.0%} power asked): " + ", ".join(
            f"#{t} (gain {g:.4g}: power {pw:.0%}, needs {n if n <= 999 else '999+'})" for t, g, pw, n in weak))
    if s.left:
        lines.append(f"{s.left} run(s) not done yet: autoloop verify --resume runs them")
    return lines


def under_powered(p: Plan) -> list[tuple[int, float, float, int]]:
    """(trial, claimed gain, the power the plan's repeats give it, the repeats it needs) of
    each kept change the verification sees with less than the power asked for."""
    if p.sigma is None or p.power is None:
        return []
    out = []
    for trial, gain in sorted(p.gains.items(), key=lambda kv: int(kv[0])):
        achieved = power_of(gain, p.sigma, p.repeats)
        if achieved < p.power:
            out.append((int(trial), gain, achieved, repeats_for(gain, p.sigma, p.power)))
    return out




def unproven(plan: Plan | None, records: list[LedgerRecord], tag: str, best: str | None) -> dict[int, str]:
    """`finalize --drop-unproven`: trial -> verdict of each kept change the verification did
    not confirm (within noise, harmful, or measured on a single pair), its group's members
    with it. Changes it could not take out of the best (a conflict, no longer there) are not
    listed: nothing says they are worthless. The verification must be of this best, finished."""
    if plan is None or plan.tag != tag:
        raise VerifyError(f"no verification of tag '{tag}': run autoloop verify first")
    if plan.best != best:
        raise VerifyError(f"the verification is of {plan.best[:7]}, but the best is now {(best or '-')[:7]}: "
                          "run autoloop verify again")
    summary = summarize(plan, records)
    left = len(pending(plan, records, False))
    if left:
        raise VerifyError(f"the verification is not finished ({left} run(s) left): autoloop verify --resume first")
    return {trial: c.decisive.verdict for c in summary.changes
            if c.decisive is not None and c.decisive.verdict != "confirmed" for trial in c.trials}
