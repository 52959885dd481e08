"""`autoloop ladder`'s plan and its verdict: the plan file, what is left to run, and the
verdict, as pure functions of the plan and the ledger (ladder.py runs the plan; the report
reads the verdict from here).

The plan (``results/ladder/plan.json``, written before the first run) names the change
(a kept trial, its commit and its parent), the rungs (the constants each sets, its budget,
which one is held out), and each side run at each rung (the parent, the change, or for a
tuning constant the change with that constant times a multiplier), the trial it runs as and
its commit, and the K seeds. A run of side s, seed k, is the ledger's record of kind
``verify`` in s's trial whose ``extra.ladder.repeat`` is k; recovery's record of an
interrupted run carries no such key, so that run counts as not done.

How Δ, the fit and the verdicts are computed: ``core/ladder_fit.py``; the effective compute
multiplier a plain change's verdict is read on: ``core/compute_multiplier.py``.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from autoloop.core.compute_multiplier import (
    ParentCurve,
    RungMultiplier,
    fit_parent,
    multiplier_verdict,
    rung_multiplier,
)
from autoloop.core.durations import format_duration
from autoloop.core.errors import AutoloopError
from autoloop.core.ladder_fit import (
    MULTIPLIERS,
    RungDelta,
    RungOptimum,
    Verdict,
    along_compute,
    delta_verdict,
    early_verdict,
    retune_verdict,
    rung_deltas,
    rung_optimum,
    sci,
)
from autoloop.core.layout import Layout
from autoloop.store import queries
from autoloop.store.atomic import atomic_write
from autoloop.store.ledger import LedgerRecord

LADDER_PROPOSER = "ladder"
BudgetMode = Literal["fixed", "scaled"]


class LadderError(AutoloopError):
    """The ladder cannot start or go on; one line for the user."""


class Rung(BaseModel):
    index: int
    values: dict[str, str]                 # the constants set at this rung
    budget: float                          # seconds of training
    held_out: bool = False
    params_est: float | None = None        # 12·DEPTH·WIDTH², when the target has both
    compute_est: float | None = None       # nominal compute, relative to rung 0 (the plan's spacing)

    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.values.items()) or "as is"


class Side(BaseModel):
    rung: int
    role: Literal["parent", "change", "sweep"]
    multiplier: float | None = None        # sweep: the tuning constants times this
    commit: str
    trial: int

    def label(self) -> str:
        return f"×{self.multiplier:g}" if self.role == "sweep" else self.role


class LadderPlan(BaseModel):
    tag: str
    best: str
    change: int                            # the kept change's trial
    description: str
    parent: str
    child: str
    direction: Literal["min", "max"]
    seeds: list[int]
    budget_mode: BudgetMode = "fixed"
    derived: bool = True                   # rungs from the size constants (else --rung)
    rungs: list[Rung] = Field(default_factory=list)
    sides: list[Side] = Field(default_factory=list)
    retune: dict[str, float] = Field(default_factory=dict)   # tuning constant -> the change's value
    target_params: float | None = None
    created_at: float = 0.0


def load_plan(layout: Layout) -> LadderPlan | None:
    path = layout.ladder_plan
    if not path.exists():
        return None
    try:
        return LadderPlan.model_validate_json(path.read_text())
    except (ValidationError, ValueError) as e:
        raise LadderError(f"{path} cannot be read ({str(e).splitlines()[0]}); move it aside to start a new "
                          "ladder") from None


def save_plan(layout: Layout, plan: LadderPlan) -> None:
    layout.ladder_plan.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(layout.ladder_plan, plan.model_dump_json(indent=1) + "\n")


# ------------------------------------------------------------------------------ what is left to run


def run_info(record: LedgerRecord) -> dict[str, Any]:
    info = record.extra.get("ladder")
    return info if isinstance(info, dict) else {}


def _done(record: LedgerRecord, side: Side, repeat: int) -> bool:
    return (record.kind == "verify" and record.trial == side.trial and run_info(record).get("repeat") == repeat
            and not queries.was_interrupted(record))


def pending(plan: LadderPlan, records: list[LedgerRecord]) -> list[tuple[Side, int]]:
    """The (side, seed) runs with no record yet, in the order they run: rung by rung, smallest
    first, and within a rung seed by seed, every side of it back to back (interleaved)."""
    ours = [r for r in records if r.kind == "verify" and run_info(r)]
    return [(s, k) for rung in plan.rungs for k in range(len(plan.seeds)) for s in plan.sides
            if s.rung == rung.index and not any(_done(r, s, k) for r in ours)]


# ------------------------------------------------------------------------------ the verdict


@dataclass(frozen=True)
class RungResult:
    rung: Rung
    compute: float                           # measured 6·N·D, else the nominal compute
    params: float                            # measured N, else the estimate
    delta: RungDelta
    runs: dict[str, dict[int, float]]        # side label -> seed index -> metric
    optimum: RungOptimum | None = None
    multiplier: RungMultiplier | None = None   # a plain change's effective compute multiplier here


@dataclass(frozen=True)
class LadderSummary:
    plan: LadderPlan
    rungs: list[RungResult]
    measured: bool                           # compute from the runs' params and tokens (else nominal)
    verdict: Verdict
    left: int
    crashed: int
    axis: str = "compute"                    # the fit's x: "compute", or "params" where compute does not grow
    curve: ParentCurve | str | None = None   # the parent's loss along the axis, or why none (a plain change)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _params(m: dict[str, float]) -> float | None:
    """N: the matmul weights train.py reports (matmul_params_M), else all its parameters."""
    n = m.get("matmul_params_M") or m.get("num_params_M")
    return n * 1e6 if n else None


def _tokens(m: dict[str, float]) -> float | None:
    """D: total_tokens_M, else tokens/s × training seconds (a short run prints 0.0 million)."""
    if m.get("total_tokens_M"):
        return m["total_tokens_M"] * 1e6
    if m.get("tokens_per_sec") and m.get("training_seconds"):
        return m["tokens_per_sec"] * m["training_seconds"]
    return None


def summarize(plan: LadderPlan, records: list[LedgerRecord]) -> LadderSummary:
    """The verdict of the runs recorded so far: a pure function of the plan and the ledger."""
    by_trial = {s.trial: s for s in plan.sides}
    runs: dict[int, dict[str, dict[int, float]]] = {r.index: {} for r in plan.rungs}
    sizes: dict[int, tuple[list[float], list[float]]] = {r.index: ([], []) for r in plan.rungs}
    crashed = 0
    for rec in records:
        side, info = by_trial.get(rec.trial), run_info(rec)
        if side is None or rec.kind != "verify" or not info:
            continue
        if rec.status == "crash" or rec.metric is None:
            crashed += 1
            continue
        runs[side.rung].setdefault(side.label(), {})[int(info.get("repeat", -1))] = rec.metric
        n, d = _params(rec.metrics), _tokens(rec.metrics)
        if n and d:
            sizes[side.rung][0].append(n)
            sizes[side.rung][1].append(6 * n * d)
    measured = all(sizes[r.index][1] for r in plan.rungs)
    computes, params = [], []
    for r in plan.rungs:
        computes.append((_mean(sizes[r.index][1]) if measured else r.compute_est) or 4.0 ** r.index)
        params.append(_mean(sizes[r.index][0]) or r.params_est or 2.0 ** r.index)
    # The nominal compute grows by the plan's construction; a measured one may not (ladder_fit).
    axis = "compute" if not measured or along_compute(computes) else "params"
    xs = [math.log10(v) for v in (computes if axis == "compute" else params)]
    change_side = "×1" if plan.retune else "change"
    pairs = [[(runs[r.index]["parent"][k], runs[r.index][change_side][k])
              for k in sorted(set(runs[r.index].get("parent", {})) & set(runs[r.index].get(change_side, {})))]
             for r in plan.rungs]
    deltas = rung_deltas(xs, pairs, plan.direction)
    optima = [_optimum(plan, runs[r.index], math.log10(p)) for r, p in zip(plan.rungs, params, strict=True)]
    curve, mults = _multipliers(plan, runs, xs, deltas)
    results = [RungResult(r, c, p, d, runs[r.index], o, m)
               for r, c, p, d, o, m in zip(plan.rungs, computes, params, deltas, optima, mults, strict=True)]
    left = len(pending(plan, records))
    return LadderSummary(plan, results, measured, _verdict(plan, results, left, axis, curve), left, crashed, axis,
                         curve)


def _parent_loss(plan: LadderPlan, runs: dict[int, float]) -> float | None:
    """The parent's mean at a rung as a loss (lower is better, whichever way the metric points)."""
    mean = _mean(list(runs.values()))
    return None if mean is None else (mean if plan.direction == "min" else -mean)


def _multipliers(plan: LadderPlan, runs: dict[int, dict[str, dict[int, float]]], xs: list[float],
                 deltas: list[RungDelta]) -> tuple[ParentCurve | str | None, list[RungMultiplier | None]]:
    """The parent's curve over the rungs and each rung's multiplier (a plain change only)."""
    none: list[RungMultiplier | None] = [None] * len(plan.rungs)
    if plan.retune:
        return None, none
    losses = [_parent_loss(plan, runs[r.index].get("parent", {})) for r in plan.rungs]
    known = [(x, v) for x, v in zip(xs, losses, strict=True) if v is not None]
    if len(known) < len(losses):
        return "a rung without a parent run", none
    curve = fit_parent([x for x, _ in known], [v for _, v in known])
    if isinstance(curve, str):
        return curve, none
    # The parent's SE at each rung from its sd pooled over the rungs, as Δ's is (rung_deltas).
    sides = [list(runs[r.index].get("parent", {}).values()) for r in plan.rungs]
    dof = sum(len(v) - 1 for v in sides if len(v) >= 2)
    sd = math.sqrt(sum(statistics.variance(v) * (len(v) - 1) for v in sides if len(v) >= 2) / dof) if dof else 0.0
    return curve, [rung_multiplier(curve, x, loss, d, sd / math.sqrt(len(v)))
                   for x, (_, loss), d, v in zip(xs, known, deltas, sides, strict=True)]


def _optimum(plan: LadderPlan, runs: dict[str, dict[int, float]], log_params: float) -> RungOptimum | None:
    if not plan.retune:
        return None
    by_mult = {m: list(runs.get(f"×{m:g}", {}).values()) for m in MULTIPLIERS}
    if sum(1 for v in by_mult.values() if v) < 3:
        return None
    return rung_optimum(log_params, by_mult, plan.direction)


def _verdict(plan: LadderPlan, results: list[RungResult], left: int, axis: str,
             curve: ParentCurve | str | None = None) -> Verdict:
    if left:
        return Verdict("INCOMPLETE", f"INCOMPLETE: {left} run(s) not done yet: autoloop ladder --resume runs them")
    fit, held = [r for r in results if not r.rung.held_out], next(r for r in results if r.rung.held_out)
    if plan.retune:
        optima = [r.optimum for r in fit if r.optimum is not None]
        if held.optimum is None or len(optima) < 2:
            return Verdict("INCOMPLETE", "INCOMPLETE: too few sweeps gave a metric to fit the optimum")
        target = math.log10(plan.target_params or held.params)
        return retune_verdict(plan.retune, optima, held.optimum, target)
    early = early_verdict([r.delta for r in fit], held.delta, axis)
    if early is not None:
        return early
    why = curve if isinstance(curve, str) else "no parent curve"
    if isinstance(curve, ParentCurve) and held.multiplier is not None:
        fit_mults = [r.multiplier for r in fit if r.multiplier is not None]
        read = multiplier_verdict([r.delta for r in fit], held.delta, fit_mults, held.multiplier, curve, axis)
        if isinstance(read, Verdict):
            return read
        why = read
    # No multiplier can be made: the verdict is read on Δ, as a line in log-compute, and says why.
    old = delta_verdict([r.delta for r in fit], held.delta, axis)
    return Verdict(old.name, f"{old.line} (read on Δ: no {'compute' if axis == 'compute' else 'parameter'} "
                   f"multiplier: {why})", old.numbers)


# ------------------------------------------------------------------------------ what is shown


def budget_text(plan: LadderPlan) -> str:
    budgets = sorted({r.budget for r in plan.rungs})
    if len(budgets) == 1:
        return f"the budget fixed at {format_duration(budgets[0])} for every rung"
    how = "scaled with the parameters squared (tokens ∝ parameters)" if plan.budget_mode == "scaled" else "per rung"
    return f"the budget {how}: {', '.join(format_duration(r.budget) for r in plan.rungs)}"


def rung_line(r: RungResult, measured: bool) -> str:
    d = r.delta
    delta = f"Δ {d.mean:+.4g} ± {d.se:.2g} (n={d.n})" if d.mean is not None and d.se is not None else \
        (f"Δ {d.mean:+.4g} (n={d.n})" if d.mean is not None else "Δ -")
    opt = f", best multiplier ×{2 ** r.optimum.log2_m:.3g}" if r.optimum is not None else ""
    m = r.multiplier
    if m is not None and m.value is not None:
        band = f" (80 % ×{m.interval[0]:.3g}..×{m.interval[1]:.3g})" if m.interval else ""
        opt += f", multiplier ×{m.value:.3g}{band}"
    held = " [held out]" if r.rung.held_out else ""
    return (f"rung {r.rung.index + 1} {r.rung.label()}{held}: N={sci(r.params)}, "
            f"C={sci(r.compute)}{'' if measured else ' (nominal)'}, {delta}{opt}")


def summary_lines(s: LadderSummary) -> list[str]:
    p = s.plan
    what = (f"a sweep of {', '.join(p.retune)} (×0.25..×4) and the parent" if p.retune else "the change and its parent")
    lines = [f"ladder of #{p.change} {p.description} ({p.child[:7]} vs its parent {p.parent[:7]}): {len(p.rungs)} "
             f"rungs ({'from the size constants' if p.derived else 'given by --rung'}), the largest held out; "
             f"{what}, {len(p.seeds)} paired seeds each; {budget_text(p)}; Δ > 0: the change helps "
             f"({'lower' if p.direction == 'min' else 'higher'} is better); compute C = 6·N·D "
             f"{'from the runs' if s.measured else 'nominal (the runs print no num_params_M and total_tokens_M)'}"]
    lines += ["  " + rung_line(r, s.measured) for r in s.rungs]
    if s.axis == "params":
        lines.append(f"compute does not grow along the rungs (C {sci(min(r.compute for r in s.rungs))} to "
                     f"{sci(max(r.compute for r in s.rungs))}: {budget_text(p)}, the device's throughput falls as "
                     "the model grows): Δ is fitted against log N, the parameters; --budget-mode scaled grows "
                     "the tokens with them")
    if s.crashed:
        lines.append(f"crashed runs (left out of the pairs): {s.crashed}")
    lines.append(s.verdict.line)
    return lines


# `ladder --json`'s schema (autoloop/review/schemas/ladder.schema.json, docs/agents.md); a
# field is only ever added within a version.
LADDER_SCHEMA, LADDER_VERSION = "autoloop.ladder", 1


def summary_json(s: LadderSummary) -> str:
    p = s.plan
    rungs = [{"rung": r.rung.index + 1, "values": r.rung.values, "budget_s": r.rung.budget, "held_out": r.rung.held_out,
              "params": r.params, "compute": r.compute, "delta": r.delta.mean, "se": r.delta.se, "pairs": r.delta.n,
              "best_multiplier": 2 ** r.optimum.log2_m if r.optimum else None,
              "compute_multiplier": r.multiplier.value if r.multiplier else None,
              "compute_multiplier_interval": list(r.multiplier.interval) if r.multiplier and r.multiplier.interval
              else None,
              "runs": {k: {str(i): v for i, v in sorted(m.items())} for k, m in r.runs.items()}} for r in s.rungs]
    return json.dumps({"schema": LADDER_SCHEMA, "version": LADDER_VERSION, "change": p.change,
                       "description": p.description, "commit": p.child, "parent": p.parent,
                       "direction": p.direction, "seeds": p.seeds, "budget": budget_text(p),
                       "compute_measured": s.measured, "axis": s.axis, "retune": p.retune, "rungs": rungs,
                       "verdict": {"name": s.verdict.name, "line": s.verdict.line, "numbers": s.verdict.numbers},
                       "left": s.left, "crashed": s.crashed}, indent=1)


# ------------------------------------------------------------------------------ finalize


def record_verdict(layout: Layout, s: LadderSummary) -> None:
    """A finished ladder's verdict, kept by change (a later ladder of the same change replaces it)."""
    path = layout.ladder_verdicts
    kept = json.loads(path.read_text()) if path.exists() else {}
    kept[str(s.plan.change)] = {"tag": s.plan.tag, "best": s.plan.best, "verdict": s.verdict.name,
                                "line": s.verdict.line}
    atomic_write(path, json.dumps(kept, indent=1) + "\n")


def unproven(layout: Layout, tag: str) -> dict[int, str]:
    """`finalize --drop-unproven`: trial -> verdict of each kept change whose finished ladder
    said SCALE-BOUND, NOISE or not predictive."""
    path = layout.ladder_verdicts
    if not path.exists():
        return {}
    try:
        kept = json.loads(path.read_text())
    except ValueError:
        raise LadderError(f"{path} cannot be read; move it aside") from None
    return {int(t): f"{v['verdict']} in autoloop ladder" for t, v in kept.items()
            if v.get("tag") == tag and Verdict(v.get("verdict", ""), "").unproven}
