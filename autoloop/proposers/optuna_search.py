"""Bayesian and evolutionary search over the target's constants with Optuna (``--proposer optuna``).

Each proposal is one Optuna trial: the sampler (``--sampler tpe|cmaes|gp``) suggests a value
for every dimension of the search space (:mod:`autoloop.proposers.space`, built from the
target at the baseline commit), the values are written into the target's literals on top
of the current best, and the description lists the moves, ``MATRIX_LR 0.02 -> 0.031,
WARMDOWN_FRAC 0.4 -> 0.55``. Optuna is used through ask/tell with a SQLite study in
``results/optuna.db`` (one study per night, named after the baseline commit).

The ledger is the truth, as for the mutator: nothing is told to Optuna when a run ends.
At each proposal, every suggestion still open in the study is settled from the ledger first:

* its trial was measured: the judged value is told (the mean of the runs when a
  confirmation re-ran it);
* it crashed, or its proposal failed: told as failed;
* it was interrupted (the orchestrator stopped or was killed before a value existed), or
  nothing was recorded for it: told as failed and put back in the queue once, so the next
  proposal runs the same point.

Suggestions are tied to records by the autoloop trial number (stored on the Optuna trial
when it is asked) and checked against the Optuna trial number the record carries
(``extra.optuna.trial``), so a kill at any moment between ask and record leaves nothing
mis-attributed. Suggestions still running in another worker are left open.

Points measured by anyone else (the baseline, the mutator or an agent in a portfolio) are
added to the study as completed trials when they fall inside the space, so the sampler
learns from the whole night. A suggestion that would write a point already measured (or
crashed) is not run again: it is told the known outcome at once and the sampler is asked
again; after MAX_DRAWS such draws in one proposal the search has converged and the proposer
returns None (no more ideas).

Samplers are rebuilt at every proposal with a seed drawn from ``--seed`` and the number of
trials in the study, so a resumed night continues the sequence instead of repeating it;
CMA-ES keeps its own state in the study.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from autoloop.core.layout import OPTUNA_STUDY, Layout
from autoloop.proposers.base import Proposal, ProposalFailed, ProposalRequest, ProposerError
from autoloop.proposers.mutate import PROFILE_VAR, MutateError, _canon, profile_bounds
from autoloop.proposers.outcomes import TrialResult, trial_outcomes
from autoloop.proposers.space import Key, Space, build_space
from autoloop.proposers.warm_start import EarlierPoint, rebased
from autoloop.repo.workspace import Workspace, WorkspaceError
from autoloop.store import queries
from autoloop.store.ledger import Ledger, LedgerRecord

if TYPE_CHECKING:   # Optuna is optional (autoloop[hpo]): imported when a proposal needs it
    from optuna import Study
    from optuna.distributions import BaseDistribution
    from optuna.samplers import BaseSampler
    from optuna.storages import RDBStorage
    from optuna.trial import FrozenTrial

STUDY_FILE = OPTUNA_STUDY   # under results/ (layout.py)
SAMPLERS = ("tpe", "cmaes", "gp")
# Draws per proposal: each one already measured (or infeasible) is settled without a run and
# the sampler asked again; this many in a row means the search has nowhere new to go.
MAX_DRAWS = 25
# Random draws before TPE and GP start modelling (Optuna's default is 10): the baseline and
# other proposers' points count too, and every draw costs a whole trial.
STARTUP_TRIALS = 8
INSTALL_HINT = "pip install 'autoloop[hpo]'"


class OptunaSetupError(ProposerError):
    """Optuna (or the sampler's own dependency) is not installed; one line for the user."""


def check_installed(sampler: str) -> None:
    """Raise OptunaSetupError naming what to install, before the night starts."""
    try:
        __import__("optuna")
    except ImportError:
        raise OptunaSetupError(f"--proposer optuna needs Optuna, which is not installed: {INSTALL_HINT}") from None
    needs = {"cmaes": ("cmaes", "the cmaes package"), "gp": ("scipy", "SciPy")}.get(sampler)
    if needs:
        try:
            __import__(needs[0])
        except ImportError:
            raise OptunaSetupError(f"--sampler {sampler} needs {needs[1]}, which is not installed: "
                                   f"{INSTALL_HINT}") from None


def _optuna() -> ModuleType:
    import optuna

    # Its INFO lines ("Trial 3 finished with value ...") would interleave with the loop's,
    # and its warnings about experimental features are about the API, not the night.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def make_sampler(name: str, seed: int) -> BaseSampler:
    _optuna()
    from optuna import samplers

    if name == "tpe":
        # multivariate: models the constants jointly (the best learning rate depends on the
        # width); constant_liar: parallel workers do not all get the same suggestion.
        return samplers.TPESampler(seed=seed, n_startup_trials=STARTUP_TRIALS, multivariate=True,
                                          constant_liar=True)
    if name == "cmaes":
        # The space's centre is the current value of every constant: where CMA-ES starts.
        return samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if name == "gp":
        return samplers.GPSampler(seed=seed, n_startup_trials=STARTUP_TRIALS)
    raise ValueError(f"unknown sampler {name!r}")


def distributions(space: Space) -> dict[str, BaseDistribution]:
    """Optuna distributions for the space's dimensions, by parameter name."""
    dist = _optuna().distributions
    out: dict[str, BaseDistribution] = {}
    for d in space.dimensions:
        if d.kind == "bool":
            out[d.name] = dist.CategoricalDistribution([False, True])
        elif d.kind in ("pow2", "int"):
            out[d.name] = dist.IntDistribution(int(d.low), int(d.high), log=d.log)
        else:
            out[d.name] = dist.FloatDistribution(d.low, d.high, log=d.log)
    return out


def study_name(baseline_commit: str) -> str:
    return f"autoloop-{baseline_commit[:12]}"


class OptunaProposer:
    """Several constants per trial, chosen by an Optuna sampler that learns from the ledger."""

    name = "optuna"
    can_fix = False

    def __init__(self, sampler: str = "tpe") -> None:
        if sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {sampler!r}")
        self.sampler = sampler
        self._storage: RDBStorage | None = None
        self._storage_url: str | None = None
        self._spaces: dict[str, Space] = {}        # baseline commit -> its space
        self._outside: set[tuple[str, int]] = set()   # (study, trial) points read and found outside the space
        # ((storage url, study name), the study): the study kept open between proposals.
        self._open_study: tuple[tuple[str, str], Study] | None = None

    # -- the proposal ----------------------------------------------------------------------

    def propose(self, request: ProposalRequest) -> Proposal | None:
        if request.fix is not None:
            return None   # a set of values cannot be repaired: the loop records the crash and moves on
        if request.results_dir is None:
            raise ProposalFailed("optuna: the loop gave no results folder for the study")
        optuna = _optuna()
        from sqlalchemy.exc import SQLAlchemyError  # Optuna's storage layer

        records = Ledger(Path(request.results_dir)).records()
        baseline = queries.baseline(records)
        if baseline is None or not baseline.commit:
            raise ProposalFailed("optuna: no baseline in the ledger to build the search space around")
        ws = Workspace(Path(request.workspace), request.target)
        try:
            try:
                space = self._space(ws, baseline.commit, request.target, request.device)
            except WorkspaceError as e:
                raise ProposalFailed(f"optuna: {e}") from None
            try:
                study = self._study(Path(request.results_dir), request.direction, baseline.commit, space)
                in_flight = {request.trial} | {d["trial"] for d in request.in_flight if isinstance(d.get("trial"), int)}
                outcomes = trial_outcomes(records, request.direction)
                trials = study.get_trials(deepcopy=False)
                changed = self._settle(optuna, study, trials, outcomes, in_flight)
                changed |= self._observe(optuna, study, space, trials, outcomes, in_flight, ws, request.target)
                changed |= self._warm(optuna, study, space, request.earlier, records)
                if changed:
                    trials = study.get_trials(deepcopy=False)
                return self._draw(optuna, study, space, trials, outcomes, request)
            except (optuna.exceptions.OptunaError, SQLAlchemyError) as e:   # a damaged or locked study
                self._open_study = None
                raise ProposalFailed(f"optuna: results/{STUDY_FILE}: {type(e).__name__}: "
                                     f"{' '.join(str(e).split())[:160]} (move the file aside to start a new study "
                                     f"that relearns the night from the ledger)") from None
        finally:
            ws.close()

    def _space(self, ws: Workspace, baseline_commit: str, target: str, device: str) -> Space:
        if baseline_commit not in self._spaces:
            text = ws.file_at(baseline_commit, target)
            if text is None:
                raise ProposalFailed(f"optuna: {target} is not in the baseline commit {baseline_commit[:7]}")
            try:
                source = text.encode("utf-8")
                space = build_space(source, profile_bounds(source, device, os.environ.get(PROFILE_VAR) or None))
            except MutateError as e:
                raise ProposalFailed(f"optuna: {target}: {e}") from None
            if not space:
                raise ProposalFailed(f"optuna: {target} has no constants to search")
            self._spaces[baseline_commit] = space
        return self._spaces[baseline_commit]

    def _study(self, results_dir: Path, metric_direction: str, baseline_commit: str, space: Space) -> Study:
        from optuna import create_study

        url = f"sqlite:///{Layout(results_dir).optuna_study.resolve()}"
        name = study_name(baseline_commit)
        if self._open_study is not None and self._open_study[0] == (url, name):
            return self._open_study[1]
        if self._storage is None or self._storage_url != url:
            self._storage, self._storage_url = _sqlite_storage(url), url
        direction: Literal["minimize", "maximize"] = "minimize" if metric_direction == "min" else "maximize"
        study = create_study(storage=self._storage, study_name=name, direction=direction, load_if_exists=True)
        if study.direction.name.lower() != direction:
            raise ProposalFailed(f"optuna: study {name} in results/{STUDY_FILE} was made to "
                                 f"{study.direction.name.lower()} "
                                 f"the metric, not to {direction} it")
        if "space" not in study.user_attrs:   # for a person reading the study (optuna-dashboard)
            study.set_user_attr("space", [f"{d.name} {d.kind} [{d.value(d.low)}, {d.value(d.high)}]"
                                          for d in space.dimensions])
        self._open_study = (url, name), study
        return study

    # -- settling open suggestions from the ledger --------------------------------------------

    def _settle(self, optuna: ModuleType, study: Study, trials: list[FrozenTrial], outcomes: dict[int, TrialResult],
                in_flight: set[int]) -> bool:
        """Tell every open suggestion its outcome from the ledger; whether any was told."""
        fail = optuna.trial.TrialState.FAIL
        told = False
        for t in trials:
            trial = (t.user_attrs.get("autoloop") or {}).get("trial")
            if t.state != optuna.trial.TrialState.RUNNING or trial in in_flight:
                continue
            told = True
            o = outcomes.get(trial) if isinstance(trial, int) else None
            ours = o is not None and (o.first.extra.get("optuna") or {}).get("trial") == t.number
            if o is not None and ours and (o.status == "pruned" or (o.status == "measured" and o.scouted_out)):
                # Stopped at the scout rung (--scout) or behind the best's curve (--prune):
                # pruned, as Optuna names a trial cut short; a scout value would read as a full
                # run's, and worse.
                study.tell(t.number, state=optuna.trial.TrialState.PRUNED)
            elif o is not None and o.status == "measured" and ours:
                study.tell(t.number, o.value)
            elif o is None or o.status == "interrupted" or (o.status != "measured" and not ours):
                # Never measured: the same point goes first in the queue (once: a point that
                # is interrupted twice may be what stops the orchestrator).
                study.tell(t.number, state=fail)
                if t.user_attrs.get("requeued_from") is None and t.params:
                    study.enqueue_trial(dict(t.params), user_attrs={"requeued_from": t.number})
            else:   # crashed, the proposal failed, or (defensively) someone else's record
                study.tell(t.number, state=fail)
        return told

    def _observe(self, optuna: ModuleType, study: Study, space: Space, trials: list[FrozenTrial],
                 outcomes: dict[int, TrialResult], in_flight: set[int], ws: Workspace, target: str) -> bool:
        """Add every measured point of the night that no suggestion made (the baseline, other
        proposers' trials) as a completed trial, when it lies inside the space; whether any was."""
        # A trial number is owned by the suggestion that ran as it, not by draws settled
        # without a run (in a portfolio another member may have proposed that trial then).
        owned = {(t.user_attrs.get("autoloop") or {}).get("trial") for t in trials
                 if not t.user_attrs.get("duplicate") and not t.user_attrs.get("infeasible")}
        dists = None
        for trial, o in outcomes.items():
            if (trial in owned or trial in in_flight or o.status != "measured" or o.scouted_out or not o.commit
                    or (study.study_name, trial) in self._outside):
                continue
            try:
                text = ws.file_at(o.commit, target)
            except WorkspaceError:   # a commit git no longer has: nothing to learn from
                text = None
            values = space.read(text.encode("utf-8")) if text is not None else {}
            params = space.params(values)
            if params is None:
                self._outside.add((study.study_name, trial))
                continue
            dists = dists or distributions(space)
            study.add_trial(optuna.trial.create_trial(
                params=params, distributions=dists, value=o.value,
                user_attrs={"autoloop": {"trial": trial, "values": values, "observed": o.proposer}}))
        return dists is not None

    @staticmethod
    def _warm(optuna: ModuleType, study: Study, space: Space, earlier: list[EarlierPoint],
              records: list[LedgerRecord]) -> bool:
        """Once per study: earlier comparable nights' measured points as completed trials,
        their values re-based onto this night's baseline (warm_start.py), so the sampler
        models from the first proposal and never asks again for a point already measured."""
        if not earlier or study.user_attrs.get("warm_started"):
            return False
        base = queries.baseline_estimate(records)
        dists, added = distributions(space), 0
        for point in earlier:
            value = rebased(point, base.metric if base is not None else None)
            if value is None or point.source is None:
                continue
            values = space.read(point.source.encode("utf-8"))
            params = space.params(values)
            if params is None:
                continue
            study.add_trial(optuna.trial.create_trial(
                params=params, distributions=dists, value=value,
                user_attrs={"autoloop": {"values": values, "observed": point.label}, "warm": point.tag}))
            added += 1
        study.set_user_attr("warm_started", added)
        return added > 0

    # -- drawing a new point -------------------------------------------------------------------

    @staticmethod
    def _measured(optuna: ModuleType, trials: list[FrozenTrial], space: Space,
                  outcomes: dict[int, TrialResult]) -> dict[Key, float | None]:
        """Point key -> its value (None: it crashed), for every point the night has run."""
        states = optuna.trial.TrialState
        out: dict[Key, float | None] = {}
        for t in trials:
            info = t.user_attrs.get("autoloop") or {}
            values = info.get("values")
            settled = t.state in (states.COMPLETE, states.FAIL, states.PRUNED)
            if not settled or not values or t.user_attrs.get("infeasible"):
                continue
            if t.state == states.COMPLETE:
                out[space.key(values)] = t.value
                continue
            if t.state == states.PRUNED:   # scouted out: not worth a full run, like a crash
                out.setdefault(space.key(values), None)
                continue
            o = outcomes.get(info["trial"]) if "trial" in info else None
            if o is not None and o.status in ("crash", "skip") and _optuna_trial(o) == t.number:
                out.setdefault(space.key(values), None)
        return out

    def _draw(self, optuna: ModuleType, study: Study, space: Space, trials: list[FrozenTrial],
              outcomes: dict[int, TrialResult], request: ProposalRequest) -> Proposal | None:
        path = Path(request.workspace) / request.target
        source = path.read_bytes()
        measured = self._measured(optuna, trials, space, outcomes)
        # Points other workers are running now: not measured yet, but not to be run twice.
        running = {space.key(t.user_attrs["autoloop"]["values"]) for t in trials
                   if t.state == optuna.trial.TrialState.RUNNING and (t.user_attrs.get("autoloop") or {}).get("values")}
        current = space.read(source)
        if request.parent_metric is not None and space.params(current) is not None:
            measured.setdefault(space.key(current), request.parent_metric)   # the best, as it stands
        study.sampler = make_sampler(self.sampler, _seed(request.seed, len(trials)))
        dists = distributions(space)
        fail = optuna.trial.TrialState.FAIL
        for _ in range(MAX_DRAWS):
            trial = study.ask(dists)
            try:
                values = space.values(trial.params)
                trial.set_user_attr("autoloop", {"trial": request.trial, "values": values, "sampler": self.sampler})
                why = space.infeasible(values)
                if why:
                    trial.set_user_attr("infeasible", why)
                    study.tell(trial, state=fail)
                    continue
                key = space.key(values)
                new_source, moves = space.write(source, values)
                if key in running:
                    trial.set_user_attr("duplicate", True)
                    study.tell(trial, state=fail)
                    continue
                if key in measured or not moves:
                    known = measured.get(key, request.parent_metric if not moves else None)
                    trial.set_user_attr("duplicate", True)
                    if known is None:
                        study.tell(trial, state=fail)
                    else:
                        study.tell(trial, known)
                    continue
                written = space.read(new_source)
                if any(_canon(written[n]) != _canon(values[n]) for n in written):   # never write what we did not mean
                    raise ProposalFailed(f"optuna: rewriting {request.target} did not give the values suggested")
                path.write_bytes(new_source)
            except BaseException:
                # Never leave a suggestion open that no record will ever settle.
                study.tell(trial, state=fail, skip_if_finished=True)
                raise
            return Proposal(description=", ".join(moves), source="optuna",
                            extra={"optuna": {"trial": trial.number, "sampler": self.sampler,
                                              "study": study.study_name}})
        return None


def _sqlite_storage(url: str) -> RDBStorage:
    """Optuna's SQLite storage in WAL mode with synchronous=NORMAL: a commit is then not an
    fsync (Optuna writes one per parameter, some 20 per proposal), and still survives the
    orchestrator being killed. A power cut may take back the last few writes; the next
    proposal settles the study from the ledger again, which is all it depends on."""
    from optuna.storages import RDBStorage
    from sqlalchemy import event

    storage = RDBStorage(url)

    def fast_commits(dbapi_connection: Any, _record: object) -> None:   # a DB-API connection: sqlite3's
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(storage.engine, "connect", fast_commits)
    storage.engine.dispose()   # connections opened while Optuna set the schema up get the pragmas too
    return storage


def _seed(seed: int, n_trials: int) -> int:
    """A sampler seed per proposal: reproducible for a night, never the same twice in it."""
    return int(hashlib.sha256(f"autoloop-optuna:{seed}:{n_trials}".encode()).hexdigest()[:8], 16)


def _optuna_trial(outcome: TrialResult) -> object:
    """The Optuna trial number the proposal of this outcome was drawn as (None: not by Optuna)."""
    return (outcome.first.extra.get("optuna") or {}).get("trial")
