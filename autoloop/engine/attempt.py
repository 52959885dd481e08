"""One attempt: commit, run, check the inputs, record (docs/failures.md).

An :class:`AttemptRunner` belongs to one worker :class:`~autoloop.engine.slot.Slot` (a work
tree, a state file, a device). ``run(plan)`` takes a
:class:`~autoloop.engine.candidate.Candidate` (what to run: a commit, or the edit in the
slot's work tree to commit now) and, phase by phase, each persisted before it starts:

1. checks the measurement's protected inputs (a proposer may have changed them: restored,
   the run stands, the record says so);
2. ``committing``: commits the edit (or checks out the candidate's commit) and saves it
   under its trial ref, so nothing tried is ever lost;
3. ``running``: runs the trial through the executor (its own session, budget, hard
   timeout, whole-tree kill, streamed log);
4. ``judging``, under the arbiter's lock: checks the inputs again (changed during the run:
   the attempt is invalid), puts back what the run wrote into the repository, classifies the
   outcome, has the arbiter decide against the best *now* and append the record (a trial the
   cluster kept ending past the executor's retries is recorded ``ended``: no verdict);
5. leaves the work tree at the best (or at the candidate, for a confirmation re-run) and the
   state idle.
"""

from __future__ import annotations

import functools
import secrets
import time
from dataclasses import dataclass
from typing import cast

from autoloop.config.settings import Settings
from autoloop.core.classify import Classification, classify
from autoloop.core.durations import default_timeout, format_duration
from autoloop.core.errors import NightError
from autoloop.core.guards import finite_metrics
from autoloop.core.keep import Decision, Facts, cluster_ended, tampered_reason
from autoloop.core.power import ConfirmCount
from autoloop.core.prune import Watch, thin
from autoloop.engine import prune
from autoloop.engine.candidate import Candidate
from autoloop.engine.night import Night
from autoloop.engine.precheck import CheckContext, CheckResult, run_checks, training_limit
from autoloop.engine.slot import Slot
from autoloop.execution.integrity import Tampering, harness_path
from autoloop.execution.machine_speed import Probe
from autoloop.execution.ranks import launch_command, throughput
from autoloop.execution.runner import TOKEN_VAR, RunOutcome, RunSpec, build_env
from autoloop.observe.console import format_verdict, live_line
from autoloop.store import machine_speed, queries
from autoloop.store.ledger import AttemptKind, Draft, Extra, LedgerRecord
from autoloop.store.scout import scout_ref
from autoloop.store.state import fault_point

AUDIT_VAR = "AUTOLOOP_AUDIT"   # "0": train.py's evaluation skips the audit slice (autoloop/evaluate.py)
PROGRESS_SAVE_S = 2.0    # the state file gets the latest progress line at most this often


@dataclass(frozen=True)
class AttemptPlan:
    trial: int
    attempt: int
    kind: AttemptKind
    candidate: Candidate
    seed: int
    prior_runs: tuple[float, ...] = ()            # metrics of earlier runs of the same commit
    noise_sample: tuple[int, int] | None = None   # (k, N): a run of the best to estimate the noise
    can_confirm: bool = True                      # a borderline gain may ask for a confirmation
    replays: int = 0                              # how often the trial's change was replayed before
    confirmation: ConfirmCount | None = None      # a confirmation's count: judged on the mean at its last run

    @property
    def label(self) -> str:
        return f"#{self.trial}" + (f".{self.attempt}" if self.attempt > 1 else "")


@dataclass(frozen=True)
class Recorded:
    """A finished attempt: its record, the decision, and for a replay the merged change."""

    plan: AttemptPlan
    record: LedgerRecord
    decision: Decision
    merged: str | None = None


def rung_limits(s: Settings, kind: AttemptKind) -> tuple[float, float]:
    """(budget, hard timeout) of an attempt: a scout run trains for --scout, under the
    configured timeout or the default rule applied to the scout budget; any other for --budget."""
    if kind != "scout" or s.scout is None:
        return s.budget, s.timeout_s
    return s.scout, s.timeout if s.timeout is not None else default_timeout(s.scout)


class AttemptRunner:
    def __init__(self, night: Night, slot: Slot, settings: Settings | None = None):
        """``settings``: what its trials run under when not the night's (verify.py's transfer
        runs: a longer budget)."""
        self.night, self.slot = night, slot
        self.settings = settings or night.settings
        self.console = slot.console or night.console
        self._progress_saved_at = 0.0
        self._checked = CheckResult()   # this attempt's --check results (precheck.py)
        self._machine: dict[str, float | str] | None = None   # machine_probe's figures for this run
        # --prune: this run's progress points, the watch over them and its stop (engine/prune.py)
        self._curve: list[tuple[float, ...]] = []   # (s, loss) or (s, loss, step)
        self._watch: Watch | None = None
        self._run_stop: prune.RunStop | None = None

    def run(self, plan: AttemptPlan) -> Recorded:
        """Commit, run, check, record (see the module docstring); returns once the state is
        idle again (or holds the candidate for its confirmation re-run)."""
        ws, state = self.slot.ws, self.slot.state
        before = self.check_inputs(plan)
        if before.unrestorable:
            raise NightError(before.message)
        started, started_mono = time.time(), time.monotonic()
        cand = plan.candidate
        state.enter("committing", trial=plan.trial, attempt=plan.attempt, kind=plan.kind, description=cand.description,
                    proposer=cand.proposer, best=cand.parent, best_metric=cand.parent_metric,
                    # A candidate committed before (a look-ahead's) is named at once: a kill before
                    # the checkout still records it, under its trial ref.
                    candidate=cand.commit if plan.kind == "candidate" else None, attempt_started_at=started)
        commit = self._commit(plan)
        ws.save_trial_ref(self.night.tag, plan.trial, plan.attempt, commit)
        diff_lines = ws.diff_lines(cand.parent, commit) if cand.parent and commit != cand.parent else 0
        state.enter("running", candidate=commit)
        outcome = self._train(plan, commit)
        state.enter("judging")
        verdict = self._verdict(outcome)
        with self.night.arbiter.lock:
            after = self.check_inputs(plan)   # restored before the record is appended
            wrote = self._put_back_run_writes(plan)   # so that a kept commit leaves a clean tree
            draft = self._draft(plan, commit, outcome, verdict, started, diff_lines, before, wrote)
            # Its duration on the monotonic clock: started_at/ended_at are the wall clock, which
            # NTP or a person can step by hours mid-attempt (benchmarks/chaos.py's clock_jump).
            draft.elapsed_s = time.monotonic() - started_mono
            self._note_git_changes(draft, before, after)
            if outcome.cluster_ended and not after and not self.night.stop.is_set():
                # No verdict on the change: the best stays, the proposer is not told it failed.
                decision, merged = cluster_ended(outcome.cluster_ended, (cand.parent, cand.parent_metric),
                                                 self.night.arbiter.best()), None
            else:
                decision, merged = self.night.arbiter.decide(self._facts(plan, commit, outcome, verdict, after), ws)
            record = self.night.arbiter.record(draft, decision, self.slot.worker)
            fault_point("recorded", plan.trial, plan.attempt)
        self._settle(plan, record, decision)
        if after.unrestorable:
            raise NightError(after.message)
        return Recorded(plan, record, decision, merged)

    # -- the steps ------------------------------------------------------------------------

    def check_inputs(self, plan: AttemptPlan) -> Tampering:
        """Verify the measurement's protected inputs and restore what changed (integrity.py);
        the snapshot is the night's, one check at a time."""
        if self.night.inputs is None:
            return Tampering()
        evidence = self.night.layout.tampered(plan.trial, plan.attempt)
        with self.night.arbiter.lock:
            found = self.night.inputs.check(evidence)
        if found:
            where = evidence.relative_to(self.night.ws.root)
            self.console.line(f"#{plan.trial}: {tampered_reason(found.paths)}; restored (changed versions in {where})")
        if found.git:
            where = evidence.relative_to(self.night.ws.root)
            self.console.line(f"#{plan.trial}: git's own configuration changed ({', '.join(found.git)}); "
                              f"put back, never run by autoloop (changed versions in {where})")
        return found

    @staticmethod
    def _note_git_changes(draft: Draft, before: Tampering, after: Tampering) -> None:
        """Changes to git's configuration or hooks found before or after the run (put back):
        recorded like an edit outside the target, the run standing."""
        changed = sorted({*draft.extra.get("git_config_changed", ()), *before.git, *after.git})
        if changed:
            draft.extra["git_config_changed"] = changed

    def _commit(self, plan: AttemptPlan) -> str:
        """The commit the attempt runs, checked out in the slot's work tree."""
        ws, cand = self.slot.ws, plan.candidate
        if cand.commit is not None:
            if ws.head() != cand.commit:
                ws.reset_to(cand.commit)
            return cand.commit
        message = f"{cand.description}\n\nautoloop trial {plan.trial}.{plan.attempt} ({cand.proposer})"
        commit = ws.commit_candidate(message)
        fault_point("committed", plan.trial)
        return commit

    def _train(self, plan: AttemptPlan, commit: str) -> RunOutcome:
        s, layout = self.settings, self.night.layout
        layout.runs.mkdir(parents=True, exist_ok=True)
        self._machine = None
        result = layout.result(plan.trial, plan.attempt)
        budget, timeout = rung_limits(s, plan.kind)
        env = build_env(budget, plan.seed, result, self.night.data_dir, s.device, secrets.token_hex(8),
                        harness_path=harness_path(layout.root) if self.night.inputs is not None else None)
        spec = RunSpec(
            command=launch_command(s.command_argv, s.gpus_per_trial), cwd=self.slot.ws.root, env=env | self.slot.env,
            log_path=layout.log(plan.trial, plan.attempt), result_path=result,
            name=f"autoloop-{self.night.tag}-{plan.trial}.{plan.attempt}",
            budget_s=budget, timeout_s=timeout, metric=s.metric, max_rss_gb=s.max_rss_gb,
            # Our own train.py reports through autoloop.evaluate; a val_bpb it printed by
            # itself is not a measurement. A foreign --command may only have stdout.
            require_result=s.command is None, log_cap_bytes=int(s.log_cap_mb * 2**20), isolate=s.isolate)
        if plan.kind == "scout":   # never a keep nor the baseline: its audit figure is never read
            spec.env[AUDIT_VAR] = "0"
        self._checked = self._precheck(plan, spec) if s.checks else CheckResult()
        if self._checked.failed is not None or self._checked.tampered:
            return self._unrun(spec)
        if s.checks:
            spec.timeout_s = training_limit(s.timeout_s, self._checked.seconds)
        # The run's token, recorded before it starts: recovery finds its processes (and its
        # cgroup) by it after a kill -9, also those that left the session and the tree.
        spec.env[TOKEN_VAR] = secrets.token_hex(16)
        self.slot.state.update(child_token=spec.env[TOKEN_VAR])
        self.console.line(f"{plan.label} {plan.kind}: {plan.candidate.description} [{commit[:7]}] "
                          f"training {format_duration(budget)}")
        # The machine's speed beside the run (machine_probe.py): only where the trial runs here.
        probe = Probe(s.device, self.slot.env) if s.machine_probe and self.slot.executor.name == "local" else None
        if probe is not None:
            spec.env.update(probe.start())   # empty but under the test knob AUTOLOOP_PROBE_SCALE
        self._curve, self._watch = [], None
        self._watch = prune.watch_for(self.night, plan.kind, plan.candidate.parent) if s is self.night.settings \
            else None
        self._run_stop = prune.RunStop(self.night.stop.event) if self._watch is not None else None
        try:
            progress = functools.partial(self._on_progress, plan.label, probe=probe, budget=budget)
            outcome = self.slot.executor.run(spec, on_progress=progress,
                                             stop_event=self._run_stop or self.night.stop.event,
                                             on_start=lambda pids: self._on_start(pids, probe),
                                             on_job=lambda job: self.slot.state.update(job=job))
        finally:
            if probe is not None and self.night.stop.is_set():
                probe.close()   # a stopped run's figures are not wanted: no second kernel then
            elif probe is not None:
                self._machine = probe.finish()
        self._warn_mixed_gpus(plan, outcome)
        return outcome

    def _warn_mixed_gpus(self, plan: AttemptPlan, outcome: RunOutcome) -> None:
        """A trial on another GPU model than the night's earlier ones (a partition mixing A100 and
        H100): its speed, and a train.py that sizes its batch by memory, differ; said, not refused."""
        model = outcome.job.get("gpu_model")
        if not model:
            return
        seen = {str(r.extra.get("gpu_model")) for r in self.night.arbiter.records() if r.extra.get("gpu_model")}
        if seen and model not in seen:
            self.console.line(f"warning: {plan.label} ran on GPU model {model} (node {outcome.job.get('node')}), "
                              f"the night's earlier trials on {', '.join(sorted(seen))}: a fixed budget trains "
                              "differently on each; pin one (a partition of one model, or --slurm-option constraint=)")

    def _precheck(self, plan: AttemptPlan, spec: RunSpec) -> CheckResult:
        """Run the --check commands (precheck.py), then apply the integrity rules to what
        they left: a result file at the trial's path or changed inputs invalidate the
        attempt; files they wrote in the repository are put back before training."""
        assert spec.result_path is not None
        layout = self.night.layout
        at = CheckContext(self.settings, self.slot.ws.root, self.slot.state, self.console, self.night.stop.event,
                          plan.label)
        checked = run_checks(at, spec.env, spec.result_path, spec.log_path)
        if spec.result_path.exists():
            spec.result_path.replace(spec.result_path.with_name(spec.result_path.name + ".by-check"))
            checked.tampered.append(str(spec.result_path.relative_to(self.night.ws.root)))
        checked.tampered.extend(self.check_inputs(plan).paths)
        checked.wrote = self.slot.ws.undo_run_writes(layout.quarantine(plan.trial, plan.attempt) / "check")
        if checked.wrote:
            self.console.line(f"{plan.label}: a check wrote {', '.join(checked.wrote)} in the repository; put back")
        return checked

    def _unrun(self, spec: RunSpec) -> RunOutcome:
        """The outcome of an attempt the checks ended before training: the failing check's
        run (its output is the log, the evidence), never a metric of its own."""
        ran = self._checked.outcome or RunOutcome(exit_code=0, log_path=spec.log_path)
        return ran.model_copy(update={"metric": None, "metric_error": None, "summary": {}, "result": None})

    def _pruned(self) -> str | None:
        """Why the prune stopped this run; None when it did not (or the night's stop came first)."""
        if self._watch is None or self._watch.verdict is None or self.night.stop.is_set():
            return None
        return self._watch.verdict.reason

    def _verdict(self, outcome: RunOutcome) -> Classification:
        if self._checked.failed is not None:
            return self._checked.failed
        verdict = classify(outcome)
        if outcome.killed_reason == "stopped" and self.night.stop.signal:
            verdict = verdict._replace(reason=f"interrupted ({self.night.stop.signal})")
        return verdict

    def _put_back_run_writes(self, plan: AttemptPlan) -> list[str]:
        """Put back what the run wrote into the repository (its versions kept under
        results/), so that a kept commit leaves a clean tree; the paths, for the record."""
        layout = self.night.layout
        wrote = self.slot.ws.undo_run_writes(layout.run_writes(plan.trial, plan.attempt))
        if wrote:
            where = layout.run_writes(plan.trial, plan.attempt).relative_to(self.night.ws.root)
            self.console.line(f"{plan.label}: the run wrote {', '.join(wrote)} in the repository; put back "
                              f"(its versions in {where})")
        return wrote

    def _draft(self, plan: AttemptPlan, commit: str, outcome: RunOutcome, verdict: Classification, started: float,
               diff_lines: int, before: Tampering, wrote: list[str]) -> Draft:
        """The record's measured fields (the arbiter adds the decision's); ``wrote``: what the
        run wrote into the repository (put back by _put_back_run_writes). No side effects."""
        s, cand, layout = self.settings, plan.candidate, self.night.layout
        summary, result = outcome.summary or {}, outcome.result or {}
        extra: Extra = {}
        if cand.source:
            extra["source"] = cand.source
        if cand.git_events:
            extra["git_events"] = list(cand.git_events)
        if cand.replay_of:
            extra["replay_of"] = cand.replay_of
        extra.update(cast(Extra, cand.extra))   # the proposal's facts, as its proposer wrote them
        extra["budget_s"] = s.budget   # what it trained for: autoloop verify trains as the night did
        if wrote:
            extra["run_wrote"] = wrote
        if outcome.log_cut_bytes:
            extra["log_cut_bytes"] = outcome.log_cut_bytes
        if s.checks:
            extra["checks"] = {"passed": self._checked.failed is None and not self._checked.tampered,
                               "seconds": round(self._checked.seconds, 3), **({"wrote": self._checked.wrote}
                                                                              if self._checked.wrote else {})}
        ok = verdict.kind == "ok"
        if ok and isinstance(result.get("audit_bpb"), (int, float)):
            # Held-out figure: recorded for the morning report, never decided on, never
            # shown to a proposer (the request strips it), never in results.tsv.
            extra["audit_bpb"] = result["audit_bpb"]
        extra.update(cast(Extra, outcome.job))   # executor slurm: executor, cluster, job_id
        if before:
            extra["tampered_before_run"] = before.paths
        if self._machine:
            extra["machine"] = self._machine
        if s.prune and self._curve:
            extra["curve"] = [list(p) for p in thin(self._curve)]
        if self._pruned() is not None and self._watch is not None and self._watch.verdict is not None:
            at = self._watch.points[-1][0] if self._watch.points else 0.0
            extra["prune"] = {"at_s": round(at, 2), "budget_s": rung_limits(s, plan.kind)[0],
                              "gap": self._watch.verdict.gap, "reason": self._watch.verdict.reason}
        memory_mb = summary.get("peak_vram_mb") or outcome.peak_rss_mb
        return Draft(
            trial=plan.trial, attempt=plan.attempt, kind=plan.kind, started_at=started,
            ended_at=time.time(), proposer=cand.proposer, parent=cand.parent, commit=commit,
            description=cand.description, metric_name=s.metric, metric=outcome.metric if ok else None,
            memory_gb=(memory_mb or 0) / 1024, training_seconds=summary.get("training_seconds"),
            total_seconds=summary.get("total_seconds"), wall_seconds=outcome.wall_seconds,
            exit_code=outcome.exit_code, signal=outcome.signal, diff_lines=diff_lines, seed=plan.seed,
            fingerprint=result.get("fingerprint") or self.night.fingerprint,
            log_path=layout.log_rel(plan.trial, plan.attempt), outside_changes=list(cand.outside_changes),
            extra=extra, metrics=finite_metrics(summary), **throughput(summary, s.gpus_per_trial),
            fidelity="scout" if plan.kind == "scout" else "full",
            machine_speed=self._speed(),
        )

    def _speed(self) -> float | None:
        value = (self._machine or {}).get("speed")
        return value if isinstance(value, float) else None

    def _facts(self, plan: AttemptPlan, commit: str, outcome: RunOutcome, verdict: Classification,
               after: Tampering) -> Facts:
        """What the keep decision needs to know about this run (the arbiter adds the best now)."""
        pruned = self._pruned()
        crash = (verdict.kind, verdict.reason) if verdict.kind != "ok" and pruned is None else None
        ours, theirs = self.night.fingerprint, (outcome.result or {}).get("fingerprint")
        other_data = (f"evaluated on other data (fingerprint {theirs}, expected {ours})"
                      if crash is None and theirs and ours and theirs != ours else None)
        runs = (*plan.prior_runs, outcome.metric) if outcome.metric is not None else plan.prior_runs
        cand = plan.candidate
        records = self.night.arbiter.records()
        baseline = queries.baseline(records)
        noise = self.night.arbiter.noise()
        judged = crash is None and outcome.metric is not None and plan.noise_sample is None
        adjusted = (machine_speed.for_decision(records, commit, tuple(runs), self._speed(), cand.parent, noise)
                    if judged and plan.kind in ("candidate", "fix", "confirm") else None)
        return Facts(kind=plan.kind, commit=commit, runs=tuple(runs) if crash is None else (), crash=crash,
                     other_data=other_data, tampered=(*self._checked.tampered, *after.paths),
                     parent=(cand.parent, cand.parent_metric), noise=noise,
                     noise_sample=plan.noise_sample, can_confirm=plan.can_confirm, replays=plan.replays,
                     best_runs=max(1, len(queries.runs_of(records, cand.parent))) if cand.parent else 1,
                     confirmation=plan.confirmation,
                     metrics=dict(outcome.summary), baseline_metrics=baseline.metrics if baseline else {},
                     scout=scout_ref(self.night.arbiter.records(), self.night.arbiter.best()[0])
                     if plan.kind == "scout" else None,
                     adjusted=adjusted, pruned=pruned)

    def _settle(self, plan: AttemptPlan, record: LedgerRecord, decision: Decision) -> None:
        """Git follows the record, then the state goes idle. A confirmation re-run follows at
        once on the same commit: it stays checked out, and the state stays on this recorded
        attempt, so a kill now restores the best on --resume."""
        verdict = format_verdict(plan.label, record, plan.candidate.parent_metric if record.status != "crash" else None)
        if decision.action == "confirm" and not self.night.stop.is_set():
            self.console.line(verdict)
            return
        if record.best and self.slot.ws.head() != record.best:
            self.slot.ws.reset_to(record.best)
        self.slot.state.enter("idle", candidate=None, child_pids=[], child_token=None, job=None, progress=None)
        self.console.line(verdict)

    def _on_start(self, pids: list[tuple[int, float]], probe: Probe | None) -> None:
        self.slot.state.update(child_pids=pids)
        if probe is not None:
            probe.watch(pids)

    def _on_progress(self, label: str, line: str, probe: Probe | None = None, budget: float | None = None) -> None:
        """Live line on the terminal; the state file too (for `autoloop status`), at most every 2 s.
        ``budget``: the run's own (a scout run's is --scout), which train.py's percentage is of."""
        if probe is not None:
            probe.mark()
        if self.settings.prune and budget is not None:
            self._see(line, budget, probe)
        now, st = time.time(), self.slot.state.state
        elapsed = now - st.phase_started_at if st.phase_started_at else None
        self.console.status(live_line(
            label, "training", elapsed, budget or self.settings.budget, line, st.best_metric,
            st.deadline - now if st.deadline else None))
        if now - self._progress_saved_at >= PROGRESS_SAVE_S:
            self._progress_saved_at = now
            self.slot.state.update(progress=line)

    def _see(self, line: str, budget: float, probe: Probe | None = None) -> None:
        """A progress point for the run's curve, and for the prune's watch (with the machine's
        speed so far, where probed): stopped when it says so."""
        found = prune.point(line, budget)
        if found is None:
            return
        t, loss, step = found
        self._curve.append((t, loss) if step is None else (t, loss, step))
        speed = probe.speed_so_far() if probe is not None and self._watch is not None else None
        if self._watch is not None and self._watch.see(t, loss, step, speed) and self._run_stop is not None:
            self.console.line(f"pruning the run: {self._watch.verdict.reason if self._watch.verdict else ''}")
            self._run_stop.set()
