"""`autoloop verify`: which kept changes really matter, and do they hold at a larger scale.

After a night the branch holds a chain of kept changes, each kept on one or two runs. Some
only rode along with a lucky seed. Verification measures them again, with new seeds:

1. **Ablation.** R repeats (``--repeats``, default 3) of the best, of the baseline, and of
   the best with each kept change taken out: the change's diff reverted on top of the best
   by a 3-way merge of the target without context lines (by constant where lines clash
   but the texts differ only in their constants' values: ``core/revert.py``, which
   finalize replays with too), so changes on neighbouring lines come out one by one. A change whose lines a
   later kept change rewrote is grouped with just those later changes; one that does not
   revert even so is reported as such and not run. Each change (or group) gets its
   contribution with a 95 % interval (``contributions.py`` says how, exactly).
2. **Transfer** (``--scale KEY=VALUE ...``, ``--scale-budget DURATION``): the baseline, the
   best and the best without each *confirmed* change again, with those constants rewritten
   by the mutator's literal rewriter (``proposers/mutate.py``) and/or a longer budget: does
   the gain hold there, and what fraction of it is left.

Every run is an attempt of kind ``verify`` through the engine's ``AttemptRunner``: the same
runner, integrity checks, state file and recovery. Each variant is a trial of its own, its
repeats that trial's attempts; repeat r of every variant runs with the same seed (pairs),
and the seeds are above every seed the ledger holds (never the night's). The runs
interleave (repeat 1 of every variant, then repeat 2, ...), so a slow drift of the machine
falls on all variants alike. ``keep.decide`` records each one as a discard whose best is the
best now: nothing here moves the loop's best, and after each run the work tree and branch
are back at the best (a kill in between: ``autoloop verify --resume`` puts them back).

The plan (variants, their commits made with git plumbing, trials, seeds) is written to
``results/verify/plan.json`` before the first run: ``--resume`` continues it after a kill,
running exactly the repeats that have no record (an interrupted one is recorded as such by
recovery and run again; nothing recorded is run twice). The verdict is a pure function of
the plan and the ledger (:func:`summarize`), read by the report too.
"""

from __future__ import annotations

import ast
import os
import time

from autoloop.config.settings import Settings
from autoloop.core.durations import format_duration
from autoloop.core.revert import Edit, plan_takeouts
from autoloop.engine.attempt import AttemptPlan, AttemptRunner
from autoloop.engine.candidate import Candidate
from autoloop.engine.night import Night
from autoloop.engine.slot import Slot
from autoloop.proposers.mutate import apply_move, find_constants, make_move
from autoloop.repo.workspace import Workspace
from autoloop.store import queries
from autoloop.store.ledger import LedgerRecord
from autoloop.store.state import RunState, StateFile
from autoloop.verification.verify_plan import (
    VERIFY_PROPOSER,
    ChangeNote,
    Plan,
    Summary,
    Variant,
    VerifyError,
    load_plan,
    pending,
    save_plan,
    scale_text,
    summarize,
    summary_lines,
    variant_label,
)

# ------------------------------------------------------------------------------ building variants


def scaled_source(source: str, scale: dict[str, str], where: str) -> str:
    """``source`` with each KEY's literal set to VALUE, every other byte unchanged (the
    mutator's rewriter). A key that is not a plain number or bool constant there is an error."""
    out = source.encode("utf-8")
    for key, text in scale.items():
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise VerifyError(f"--scale {key}={text}: the value must be a number or True/False") from None
        if not isinstance(value, (bool, int, float)):
            raise VerifyError(f"--scale {key}={text}: the value must be a number or True/False")
        const = next((c for c in find_constants(out) if c.name == key), None)
        if const is None or const.is_tuple:
            raise VerifyError(f"--scale {key}={text}: {where} has no constant {key} set to a number or bool")
        out = apply_move(out, make_move(const, 0, value))
    return out.decode("utf-8")


def _note(record: LedgerRecord) -> ChangeNote:
    # A kept change (queries.is_kept_change) has its commit and the parent it was built on.
    assert record.commit is not None and record.parent is not None, "a kept change without its commits"
    return ChangeNote(trial=record.trial, description=record.description.splitlines()[0] if record.description else "-",
                      commit=record.commit, parent=record.parent)


def revert_groups(ws: Workspace, best: str,
                  changes: list[LedgerRecord]) -> tuple[list[ChangeNote], list[tuple[list[int], str]]]:
    """How each kept change comes out of the best (``core.revert.plan_takeouts``): alone,
    with only the later changes that rewrote its lines, or not at all. Returns the notes,
    and each group's trials with the target's text without them."""
    notes = [_note(r) for r in changes]
    best_text = _target_at(ws, best)
    edits = [Edit(_target_at(ws, n.parent), _target_at(ws, n.commit)) for n in notes]
    groups: list[tuple[list[int], str]] = []
    for takeout in plan_takeouts(best_text, edits):
        members = [notes[k] for k in takeout.members]
        trials = [n.trial for n in members]
        for note in members:
            if takeout.text is None:
                note.revert = "conflict"
            elif takeout.text == best_text:
                note.revert = "absent"
            else:
                note.revert = "alone" if len(members) == 1 else "grouped"
                note.group = trials
        if takeout.text is not None and takeout.text != best_text:
            groups.append((trials, takeout.text))
    return notes, groups


def make_plan(night: Night, settings: Settings) -> Plan:
    """The ablation's variants (commits made with plumbing: nothing is checked out), their
    trials and the new seeds."""
    records, ws = night.arbiter.records(), night.ws
    best, best_metric = queries.best(records)
    baseline = queries.baseline(records)
    if best is None or baseline is None or not baseline.commit:
        raise VerifyError("the ledger has no baseline: nothing to verify (run autoloop run first)")
    changes = [r for r in records if queries.is_kept_change(r)]
    if not changes:
        raise VerifyError(f"no kept changes on {ws.branch_name(night.tag)}: nothing to verify")
    if settings.verify_scale:
        scaled_source(_target_at(ws, best), settings.verify_scale, f"the best {settings.target}")
        scaled_source(_target_at(ws, baseline.commit), settings.verify_scale, f"the baseline {settings.target}")
    notes, groups = revert_groups(ws, best, changes)
    first = queries.next_trial(records)
    # New seeds: above every seed the ledger holds, so no run repeats a night's draw.
    top = max([settings.seed, *(r.seed for r in records if r.seed is not None)])
    variants = [Variant(name="best", role="best", commit=best, trial=first),
                Variant(name="baseline", role="baseline", commit=baseline.commit, trial=first + 1)]
    for trials, text in groups:
        name = f"without {variant_label(trials)}"
        commit = ws.commit_text_on(best, text, f"autoloop verify: the best {name}")
        variants.append(Variant(name=name, role="without", commit=commit, trial=first + len(variants),
                                changes=trials))
    repeats, why = queries.verify_repeats(records, settings.verify_repeats, settings.verify_power)
    gains = {str(t): g for t, g in queries.kept_gains(records).items()}
    return Plan(tag=night.tag, best=best, best_metric=best_metric, baseline=baseline.commit,
                direction=settings.direction, repeats=repeats, repeats_why=why, power=settings.verify_power,
                sigma=queries.noise(records), gains=gains,
                seeds=list(range(top + 1, top + 1 + repeats)), scale=dict(settings.verify_scale),
                scale_budget=settings.verify_budget, changes=notes, variants=variants, created_at=time.time())


def _target_at(ws: Workspace, commit: str) -> str:
    """The target's text at a commit of the night (every one has it: each was run)."""
    text = ws.file_at(commit, ws.target)
    if text is None:
        raise VerifyError(f"{ws.target} is not in commit {commit[:7]}")
    return text


def plan_transfer(night: Night, plan: Plan, summary: Summary) -> Plan:
    """The transfer's variants, once the ablation is measured: the baseline, the best, and
    the best without each change the ablation confirmed, at the larger scale."""
    ws, records = night.ws, night.arbiter.records()
    confirmed = {tuple(c.trials) for c in summary.changes if c.decisive and c.decisive.verdict == "confirmed"}
    base = [v for v in plan.variants if not v.scaled and (v.role != "without" or tuple(v.changes) in confirmed)]
    first = queries.next_trial(records)
    added: list[Variant] = []
    for v in base:
        text = _target_at(ws, v.commit)
        if plan.scale:
            text = scaled_source(text, plan.scale, f"{night.settings.target} of {v.name}")
        commit = ws.commit_text_on(plan.best, text, f"autoloop verify: {v.name} at scale {scale_text(plan)}")
        added.append(Variant(name=f"{v.name} @scale", role=v.role, commit=commit, trial=first + len(added),
                             changes=v.changes, scaled=True))
    return plan.model_copy(update={"variants": [*plan.variants, *added], "transfer_planned": True})


# ------------------------------------------------------------------------------ running it


def _current_plan(night: Night, settings: Settings, resume: bool) -> Plan:
    """The plan to run: the unfinished one on --resume (if it is of this best), else a new one."""
    layout, records = night.layout, night.arbiter.records()
    old = load_plan(layout)
    best = queries.best(records)[0]
    # A night continued since (run --resume) may have taken trial numbers the plan had not used yet.
    taken = old is not None and any(r.trial in {v.trial for v in old.variants} and r.kind != "verify"
                                    for r in records)
    if old is not None and old.tag == night.tag and old.best == best and not taken:
        unfinished = summarize(old, records).left > 0 or (old.wants_transfer and not old.transfer_planned)
        if resume:
            return old
        if unfinished:
            raise VerifyError("the last verification of this branch is unfinished: pass --resume to continue it, "
                              f"or move {layout.verify_plan} aside to start over")
    elif resume and old is not None:
        night.console.line(f"verify: the plan in {layout.verify_plan.parent.name}/ is of another best; starting anew")
    plan = make_plan(night, settings)
    save_plan(layout, plan)
    return plan


def run_verification(night: Night, settings: Settings, resume: bool = False) -> Summary:
    """Plan (or resume) and run the verification; returns its verdict. The best, the branch
    and the work tree are where they were when it returns."""
    plan = _current_plan(night, settings, resume)
    console = night.console
    if resume and settings.verify_repeats is not None and plan.repeats != settings.verify_repeats:
        console.line(f"verify: resuming the plan's {plan.repeats} repeats (not --repeats {settings.verify_repeats})")
    elif plan.repeats_why:
        console.line(f"verify: {plan.repeats_why}")
    settings = _night_budget(night, settings)
    _warn_on_budget(night, settings)
    state = StateFile(night.layout.root)
    night_stop = state.state.stop_reason   # the night's own (run --verify-at-end), kept beside ours
    if state.state.tag != night.tag or "verification" in (night_stop or ""):
        night_stop = None
    state.replace(RunState(tag=night.tag, pid=os.getpid(), run_started_at=time.time()))
    slot = Slot.main(night, state)
    n_changes = len({tuple(c.group) or (c.trial,) for c in plan.changes if c.revert in ("alone", "grouped")})
    console.line(f"verify: {plan.repeats} repeats of the best, the baseline and the best without each of "
                 f"{n_changes} kept change(s) ({len(pending(plan, night.arbiter.records(), False))} runs to do)")
    _run(night, slot, AttemptRunner(night, slot, settings), plan, scaled=False)
    if plan.wants_transfer and not night.stop.is_set():
        if not plan.transfer_planned:
            plan = plan_transfer(night, plan, summarize(plan, night.arbiter.records()))
            save_plan(night.layout, plan)
        scaled_settings = settings.model_copy(update={"budget": plan.scale_budget, "timeout": None}) \
            if plan.scale_budget is not None else settings
        console.line(f"verify: transfer at {scale_text(plan)} "
                     f"({len(pending(plan, night.arbiter.records(), True))} runs to do)")
        _run(night, slot, AttemptRunner(night, slot, scaled_settings), plan, scaled=True)
    if not state.state.in_flight:
        done = "verification " + ("stopped" if night.stop.is_set() else "done")
        state.enter("stopped", stop_reason=f"{night_stop}; {done}" if night_stop else done, stopped_at=time.time())
    return summarize(plan, night.arbiter.records())


def _night_budget(night: Night, settings: Settings) -> Settings:
    """The settings with the night's budget (its records' ``budget_s``) unless a budget was
    given (--budget or the config file): the ablation must train as the night did."""
    budget = queries.night_budget(night.arbiter.records())
    if budget is None or "budget" in settings.model_fields_set or budget == settings.budget:
        return settings
    night.console.line(f"verify: training {format_duration(budget)} per run, the night's budget (from its ledger; "
                       "--budget to choose another)")
    return settings.model_copy(update={"budget": budget})


def _warn_on_budget(night: Night, settings: Settings) -> None:
    """A --budget that differs from the night's is said at once: from the budget its records
    carry, else (older ledgers) from what the baseline trained."""
    budget = queries.night_budget(night.arbiter.records())
    if budget is not None:
        if budget != settings.budget:
            night.console.line(f"verify: warning: the night trained {format_duration(budget)} per trial, these runs "
                               f"train {format_duration(settings.budget)} (--budget); leave --budget out to train as "
                               "the night did")
        return
    baseline = queries.baseline(night.arbiter.records())
    trained = baseline.training_seconds if baseline else None
    if trained and settings.budget > 0 and not 0.8 <= trained / settings.budget <= 1.25:
        night.console.line(f"verify: warning: the night's baseline trained {format_duration(trained)}, these runs "
                           f"train {format_duration(settings.budget)} (--budget); give the night's --budget to "
                           "compare like with like")


def _run(night: Night, slot: Slot, runner: AttemptRunner, plan: Plan, scaled: bool) -> None:
    for variant, repeat in pending(plan, night.arbiter.records(), scaled):
        if night.stop.is_set():
            return
        records = night.arbiter.records()
        best = queries.best(records)
        info = {"variant": variant.name, "role": variant.role, "repeat": repeat, "changes": variant.changes,
                "scaled": variant.scaled}
        candidate = Candidate(commit=variant.commit, parent=best[0], parent_metric=best[1],
                              description=f"{variant.name} (repeat {repeat + 1}/{plan.repeats})",
                              proposer=VERIFY_PROPOSER, extra={"verify": info})
        runner.run(AttemptPlan(variant.trial, queries.next_attempt(records, variant.trial), "verify", candidate,
                               plan.seeds[repeat], can_confirm=False))


def verify_at_end(night: Night, settings: Settings) -> None:
    """`autoloop run --verify-at-end`: the night's verification when its trials stop, in the
    same hold of the workspace (the scheduler kept the time for it out of --hours)."""
    if not any(queries.is_kept_change(r) for r in night.arbiter.records()):
        night.console.line("verify: no kept changes, nothing to verify")
        return
    for line in summary_lines(run_verification(night, settings, resume=settings.resume)):
        night.console.line(line)
