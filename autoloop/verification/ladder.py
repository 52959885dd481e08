"""`autoloop ladder`: does a kept change's gain hold as the model grows, and at what size
does it vanish or flip.

For the best (the kept change whose commit is the best) or a named kept change
(``--change TRIAL``), its commit against its parent commit: at each rung of a scale path
(``ladder_rungs.py``), smallest first, both sides run K paired seeds (``--seeds``, default
3; seed k the same on both sides, above every seed the ledger holds), interleaved. The
largest rung is held out: the fit of Δ against log-compute on the other rungs must predict
it (``core/ladder_fit.py``) before anything is extrapolated. A change that only moves a
tuning constant (a learning rate, weight decay, batch or schedule constant) is swept
instead: the change with the constant(s) times ¼, ½, 1, 2, 4, and the parent, at each rung.

Every run is an attempt of kind ``verify`` through the engine's ``AttemptRunner``, as
``autoloop verify``'s are: a trial per (rung, side), its seeds that trial's attempts,
``extra.ladder`` naming rung, side and seed; the sides are commits made with plumbing on the
best, so the branch and the work tree end where they started. The plan is written to
``results/ladder/plan.json`` before the first run; ``--resume`` after a kill runs exactly
the runs with no record.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from autoloop.config.settings import Settings
from autoloop.core.ladder_fit import MULTIPLIERS
from autoloop.engine.attempt import AttemptPlan, AttemptRunner
from autoloop.engine.candidate import Candidate
from autoloop.engine.night import Night
from autoloop.engine.slot import Slot
from autoloop.store import queries
from autoloop.store.ledger import LedgerRecord
from autoloop.store.state import RunState, StateFile
from autoloop.verification.ladder_plan import (
    LADDER_PROPOSER,
    BudgetMode,
    LadderError,
    LadderPlan,
    LadderSummary,
    Rung,
    Side,
    budget_text,
    load_plan,
    pending,
    record_verdict,
    run_info,
    save_plan,
    summarize,
)
from autoloop.verification.ladder_rungs import at_rung, derived_rungs, given_rungs, multiplied, tuning_constants
from autoloop.verification.verify_plan import load_plan as load_verify_plan

MIN_RUNGS = 3   # two to fit a line, one held out


@dataclass
class LadderOptions:
    change: int | None = None                       # the kept change's trial (None: the best's)
    rungs: list[str] = field(default_factory=list)  # --rung specs (empty: from the size constants)
    count: int = 4                                  # --rungs, when derived
    seeds: int = 3
    budget_mode: BudgetMode = "fixed"
    target_params: float | None = None


def _change(records: list[LedgerRecord], best: str | None, trial: int | None) -> LedgerRecord:
    kept = [r for r in records if queries.is_kept_change(r)]
    if not kept:
        raise LadderError("no kept changes on this branch: nothing to put on a ladder (run autoloop run first)")
    if trial is None:
        found = next((r for r in reversed(kept) if r.commit == best), None)
        if found is None:
            raise LadderError("the best is no kept change of this night: name one with --change TRIAL")
        return found
    found = next((r for r in reversed(kept) if r.trial == trial), None)
    if found is None:
        raise LadderError(f"--change {trial}: not a kept change; the kept changes are trials "
                          + ", ".join(str(r.trial) for r in kept))
    return found


def _text(night: Night, commit: str) -> str:
    text = night.ws.file_at(commit, night.ws.target)
    if text is None:
        raise LadderError(f"{night.ws.target} is not in commit {commit[:7]}")
    return text


def _rungs(source: str, settings: Settings, options: LadderOptions) -> list[Rung]:
    if options.rungs:
        rungs = given_rungs(options.rungs, source, settings.budget, options.budget_mode)
    else:
        rungs = derived_rungs(source, options.count, settings.budget, options.budget_mode)
    if len(rungs) < MIN_RUNGS:
        raise LadderError(f"a ladder needs at least {MIN_RUNGS} rungs (two to fit, the largest held out); "
                          f"got {len(rungs)}")
    rungs[-1] = rungs[-1].model_copy(update={"held_out": True})
    return rungs


def make_plan(night: Night, settings: Settings, options: LadderOptions) -> LadderPlan:
    """The rungs and, per rung, the sides as commits on the best (plumbing: nothing checked out)."""
    records, ws = night.arbiter.records(), night.ws
    best = queries.best(records)[0]
    change = _change(records, best, options.change)
    assert change.commit is not None and change.parent is not None and best is not None
    parent, child = _text(night, change.parent), _text(night, change.commit)
    rungs = _rungs(child, settings, options)
    retune = tuning_constants(parent, child)
    # Above the trials of a verification planned but not all run yet, as well as the ledger's.
    verifying = load_verify_plan(night.layout)
    trial = max([queries.next_trial(records), *(v.trial + 1 for v in (verifying.variants if verifying else []))])
    sides: list[Side] = []
    for rung in rungs:
        variants: list[tuple[str, float | None, str]] = [("parent", None, at_rung(parent, rung.values,
                                                                                "the parent's target"))]
        changed = at_rung(child, rung.values, "the change's target")
        if retune:
            variants += [("sweep", m, multiplied(changed, retune, m)) for m in MULTIPLIERS]
        else:
            variants.append(("change", None, changed))
        for role, mult, text in variants:
            label = f"×{mult:g}" if mult is not None else role
            commit = ws.commit_text_on(best, text, f"autoloop ladder: #{change.trial} {label} at {rung.label()}")
            sides.append(Side(rung=rung.index, role=role, multiplier=mult, commit=commit, trial=trial))  # type: ignore[arg-type]
            trial += 1
    top = max([settings.seed, *(r.seed for r in records if r.seed is not None)])
    description = change.description.splitlines()[0] if change.description else "-"
    return LadderPlan(tag=night.tag, best=best, change=change.trial, description=description, parent=change.parent,
                      child=change.commit, direction=settings.direction,
                      seeds=list(range(top + 1, top + 1 + options.seeds)), budget_mode=options.budget_mode,
                      derived=not options.rungs, rungs=rungs, sides=sides, retune=retune,
                      target_params=options.target_params, created_at=time.time())


def _current_plan(night: Night, settings: Settings, options: LadderOptions, resume: bool) -> LadderPlan:
    """The unfinished plan on --resume (if it is of this best), else a new one."""
    layout, records = night.layout, night.arbiter.records()
    old = load_plan(layout)
    best = queries.best(records)[0]
    trials = {s.trial for s in old.sides} if old else set()
    # Another command (a night continued, autoloop verify) may have taken the trial numbers since.
    taken = any(r.trial in trials and not run_info(r) and not queries.was_interrupted(r)
                for r in records)
    if old is not None and old.tag == night.tag and old.best == best and not taken:
        if resume:
            return old
        if pending(old, records):
            raise LadderError("the last ladder of this branch is unfinished: pass --resume to continue it, "
                              f"or move {layout.ladder_plan} aside to start over")
    elif resume and old is not None:
        night.console.line("ladder: the plan in ladder/ is of another best; starting anew")
    plan = make_plan(night, settings, options)
    save_plan(layout, plan)
    return plan


def run_ladder(night: Night, settings: Settings, options: LadderOptions, resume: bool = False) -> LadderSummary:
    """Plan (or resume) and run the ladder; returns its verdict. The best, the branch and the
    work tree are where they were when it returns."""
    plan = _current_plan(night, settings, options, resume)
    console = night.console
    state = StateFile(night.layout.root)
    state.replace(RunState(tag=night.tag, pid=os.getpid(), run_started_at=time.time()))
    slot = Slot.main(night, state)
    todo = pending(plan, night.arbiter.records())
    console.line(f"ladder: #{plan.change} {plan.description}: {len(plan.rungs)} rungs x {len(plan.seeds)} seeds "
                 f"x {len(plan.sides) // len(plan.rungs)} sides; {budget_text(plan)} ({len(todo)} runs to do)")
    runners: dict[float, AttemptRunner] = {}
    for side, repeat in todo:
        if night.stop.is_set():
            break
        rung = plan.rungs[side.rung]
        if rung.budget not in runners:
            same = rung.budget == settings.budget
            runners[rung.budget] = AttemptRunner(night, slot, None if same else settings.model_copy(
                update={"budget": rung.budget, "timeout": None}))
        _run_one(night, runners[rung.budget], plan, side, repeat)
    if not state.state.in_flight:
        done = "ladder " + ("stopped" if night.stop.is_set() else "done")
        state.enter("stopped", stop_reason=done, stopped_at=time.time())
    summary = summarize(plan, night.arbiter.records())
    if not summary.left:
        record_verdict(night.layout, summary)
    return summary


def _run_one(night: Night, runner: AttemptRunner, plan: LadderPlan, side: Side, repeat: int) -> None:
    records = night.arbiter.records()
    best = queries.best(records)
    rung = plan.rungs[side.rung]
    info = {"change": plan.change, "rung": side.rung, "side": side.label(), "multiplier": side.multiplier,
            "repeat": repeat, "values": rung.values}
    candidate = Candidate(commit=side.commit, parent=best[0], parent_metric=best[1],
                          description=f"ladder #{plan.change} {side.label()} at {rung.label()} (seed {repeat + 1}/"
                          f"{len(plan.seeds)})", proposer=LADDER_PROPOSER, extra={"ladder": info})
    runner.run(AttemptPlan(side.trial, queries.next_attempt(records, side.trial), "verify", candidate,
                           plan.seeds[repeat], can_confirm=False))
