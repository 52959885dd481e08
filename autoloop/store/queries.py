"""Questions asked of a ledger: pure functions of its records, in ledger order.

The ledger (``ledger.py``) reads and writes records; everything that *reads meaning* from
them lives here, once: the best so far, the baseline, the noise estimate, the runs of one
commit, the tampered attempts, the best in force before each record. The engine, ``status``,
``report``, ``plot`` and ``finalize`` all ask these, so they always agree, and none of them
imports another to get an answer (no import cycles).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import NamedTuple, TypedDict

from autoloop.core.judge import noise_estimate
from autoloop.core.keep import Best as Best  # re-exported: the engine names it queries.Best
from autoloop.core.power import ConfirmCount, chosen_repeats
from autoloop.store.ledger import LedgerRecord


def best(records: list[LedgerRecord]) -> Best:
    """The best as the latest record with a ``best`` set it (the ledger's commit point)."""
    for record in reversed(records):
        if record.best is not None:
            return record.best, record.best_metric
    return None, None


def baseline(records: list[LedgerRecord]) -> LedgerRecord | None:
    """The kept baseline record, None before there is one."""
    return next((r for r in records if r.kind == "baseline" and r.status == "keep"), None)


def best_record(records: list[LedgerRecord]) -> LedgerRecord | None:
    """The latest kept record of the best commit that is not a noise sample: the change (or
    baseline) that made it. A noise sample re-runs the best; it never made it."""
    commit = best(records)[0]
    return next((r for r in reversed(records)
                 if r.status == "keep" and r.commit == commit and not is_noise_sample(r)), None)


class BaselineEstimate(NamedTuple):
    """The baseline as every viewer shows it: the mean of its runs (the baseline's own and
    its noise samples), which is also the best the engine holds for it once they ran."""

    commit: str | None
    trial: int
    metric: float              # the mean of the runs
    sigma: float | None        # their sample standard deviation; None with one run
    runs: tuple[float, ...]


def baseline_estimate(records: list[LedgerRecord]) -> BaselineEstimate | None:
    """The baseline's mean and spread over its runs; None before a baseline with a metric."""
    base = baseline(records)
    if base is None or base.metric is None:
        return None
    runs = (base.metric, *(r.metric for r in records if is_noise_sample(r) and r.status == "keep"
                           and r.commit == base.commit and r.metric is not None))
    return BaselineEstimate(base.commit, base.trial, sum(runs) / len(runs), noise_estimate(list(runs))[0], runs)


def running_best(records: list[LedgerRecord]) -> list[float | None]:
    """For each record, the best as the night's picture shows it after that record: the
    engine's best, except that a commit's noise samples do not step it (they re-measure
    the best; they are not a change): the value a commit held as the best is the one it
    ended with, from the record that made it the best on. So the line moves only where the
    best commit changes, and, as each new best was judged against the value before it,
    it never gets worse (a --remeasure that finds a kept change worse than the best before
    it is the one exception, and a true one)."""
    out: list[float | None] = []
    start = 0            # where the current best commit's stretch began
    commit: str | None = None
    value: float | None = None
    for i, r in enumerate(records):
        if r.best is not None and r.best != commit:
            commit, value, start = r.best, r.best_metric, i
        elif r.best is not None and r.best_metric != value:
            value = r.best_metric   # the same commit re-measured: its whole stretch takes the new value
            out[start:i] = [value] * (i - start)
        out.append(value)
    return out


def best_before(records: list[LedgerRecord]) -> list[float | None]:
    """For each record, the best metric in force when it was judged (None before the baseline)."""
    out: list[float | None] = []
    current: float | None = None
    for r in records:
        out.append(current)
        if r.best is not None:
            current = r.best_metric
    return out


def is_noise_sample(record: LedgerRecord) -> bool:
    """A re-run of the best to estimate the noise (kind confirm, status keep): not a change."""
    return "noise_samples" in record.extra


def was_interrupted(record: LedgerRecord) -> bool:
    """An attempt a stop, a kill or the cluster ended before it had a verdict of its own
    (recovery's and the stop request's reason, classify's "interrupted" rule; status ``ended``):
    its change was never judged."""
    return (record.status == "crash" and record.reason.startswith("interrupted")) or record.status == "ended"


def noise(records: list[LedgerRecord]) -> float | None:
    """The noise estimate decisions use: the latest noise sample that produced one."""
    for r in reversed(records):
        if r.extra.get("noise_method") and r.noise is not None and r.status == "keep":
            return r.noise
    return None


def runs_of(records: list[LedgerRecord], commit: str) -> list[float]:
    """Metrics of the judged runs of one commit (its first run and its re-runs); runs of
    ``autoloop verify`` are not the night's judgement (their seeds are not the night's)."""
    return [r.metric for r in records
            if r.commit == commit and r.metric is not None and r.status in ("keep", "discard")
            and r.kind not in ("verify", "scout")]


def kept_gains(records: list[LedgerRecord]) -> dict[int, float]:
    """Each kept change's claimed effect: trial -> |its metric - the best before it|."""
    return {r.trial: abs(r.metric - ref) for r, ref in zip(records, best_before(records), strict=True)
            if is_kept_change(r) and r.metric is not None and ref is not None}


def verify_repeats(records: list[LedgerRecord], requested: int | None, power: float) -> tuple[int, str]:
    """The repeats a verification of this ledger runs, and one line saying why: --repeats
    when given, else from power (core/power.py) on the night's noise and smallest kept gain."""
    if requested is not None:
        return requested, f"{requested} repeat{'' if requested == 1 else 's'} (--repeats)"
    return chosen_repeats(list(kept_gains(records).values()), noise(records), power)


def under_powered_keeps(records: list[LedgerRecord]) -> list[tuple[LedgerRecord, ConfirmCount]]:
    """Kept changes whose confirmation ran fewer runs than the power asked for needs (its count
    capped): each with its count. A keep on a first run that cleared the bar had no confirmation."""
    out = []
    for r in records:
        count = ConfirmCount.of(r.extra.get("confirmation")) if is_kept_change(r) else None
        if count is not None and count.under_powered:
            out.append((r, count))
    return out


def under_powered_text(record: LedgerRecord, count: ConfirmCount) -> str:
    """'#3 (kept on 4 runs: power 53% for its first run's gain 0.0021; 80% needs 15)'."""
    need = (f"{count.asked:.0%} needs {count.needs}" if count.needs is not None
            else f"no count reaches {count.asked:.0%}")
    return (f"#{record.trial} (kept on {count.runs} runs: power {count.power:.0%} for its first run's gain "
            f"{count.gain:.4g} at σ {count.sigma:.4g}; {need})")


def is_kept_change(record: LedgerRecord) -> bool:
    """A kept record that changed something: not the baseline, not a noise sample (its
    commit is its parent), a commit on top of the best it was built on."""
    return (record.status == "keep" and record.kind != "baseline" and not is_noise_sample(record)
            and bool(record.commit) and bool(record.parent) and record.commit != record.parent)


# How attempt_counts names its groups, in the order status and the report give them.
COUNT_ORDER = ("baseline", "noise_sample", "keep", "confirm", "discard", "pruned", "crash", "ended", "skip")


def attempt_kind(record: LedgerRecord) -> str:
    """What an attempt was, for the counts: the baseline, a noise sample, a kept change
    ("keep"), a re-run of a change that was not kept ("confirm": a confirmation or replay
    that lost), or its plain status (discard, crash, ended, skip). Each attempt is one of these."""
    if record.status == "keep":
        if record.kind == "baseline":
            return "baseline"
        return "noise_sample" if is_noise_sample(record) else "keep"
    if record.status == "discard" and record.kind == "confirm":
        return "confirm"
    return record.status


def attempt_counts(records: list[LedgerRecord]) -> dict[str, int]:
    """How many attempts of each kind (``attempt_kind``), in COUNT_ORDER, the zeros left out:
    keeps count kept changes only, apart from the baseline, noise samples and re-runs."""
    counts: dict[str, int] = {}
    for r in records:
        key = attempt_kind(r)
        counts[key] = counts.get(key, 0) + 1
    return {k: counts[k] for k in sorted(counts, key=lambda k: COUNT_ORDER.index(k) if k in COUNT_ORDER else 99)}


def of_night(records: list[LedgerRecord]) -> list[LedgerRecord]:
    """The night's own attempts: the records without ``autoloop verify``'s runs (kind
    ``verify``), for what counts and plots the search."""
    return [r for r in records if r.kind != "verify"]


def cluster_ended(records: list[LedgerRecord]) -> int:
    """Jobs the cluster ended (preempted, node failure, lost, past the queue's limit): those whose
    trial was submitted again (the executor's ``resubmitted`` list) and the last of each attempt
    recorded ``ended`` (past its retries); counted apart from crashes (none says anything of a change)."""
    return sum(len(r.extra.get("resubmitted") or []) + (r.status == "ended") for r in records)


def ended_in_a_row(records: list[LedgerRecord]) -> int:
    """How many of the night's last attempts in a row the cluster ended (status ``ended``)."""
    n = 0
    for r in reversed(of_night(records)):
        if r.status != "ended":
            break
        n += 1
    return n


def next_trial(records: list[LedgerRecord]) -> int:
    """The number for a new trial: highest so far + 1; 0 (the baseline) when there is none."""
    return max((r.trial for r in records), default=-1) + 1


def next_attempt(records: list[LedgerRecord], trial: int) -> int:
    """The number for a new attempt of ``trial``."""
    return max((r.attempt for r in records if r.trial == trial), default=0) + 1


def night_budget(records: list[LedgerRecord]) -> float | None:
    """The training budget of the night's latest attempt that records one (``extra.budget_s``;
    ledgers written before it have none); autoloop verify's runs are not the night's."""
    for r in reversed(records):
        budget = r.extra.get("budget_s")
        if r.kind != "verify" and isinstance(budget, (int, float)) and budget > 0:
            return float(budget)
    return None


def attempt_seconds(r: LedgerRecord) -> float:
    """How long an attempt took: its monotonic seconds, else (a ledger from before them, an
    interrupted attempt) the span of its wall-clock stamps, never below zero. A stamp of a
    stepped clock can put that span hours off; the run's own wall_seconds bound it from below."""
    if r.elapsed_s is not None:
        return r.elapsed_s
    return max(0.0, r.ended_at - r.started_at, r.wall_seconds or 0.0)


def typical_attempt_seconds(records: list[LedgerRecord], default: float) -> float:
    """What the next attempt will likely take: the median of the last ten that ran."""
    walls = [attempt_seconds(r) for r in records[-10:] if r.status != "skip"]
    return statistics.median(walls) if walls else default


class TamperedAttempt(TypedDict):
    trial: int
    attempt: int
    when: str            # "during" the attempt or "before" its run
    status: str
    description: str
    paths: list[str]     # the protected inputs found changed


def tampered_attempts(records: list[LedgerRecord]) -> list[TamperedAttempt]:
    """Attempts that found a protected input of the measurement changed (integrity.py):
    "during" the attempt (its trial is invalid: crash, fundamental) or "before" its run
    (a proposer changed it; restored, so the run stood). Restored in both cases."""
    out: list[TamperedAttempt] = []
    for r in records:
        for key, when in (("tampered", "during"), ("tampered_before_run", "before")):
            if r.extra.get(key):
                out.append({"trial": r.trial, "attempt": r.attempt, "when": when, "status": r.status,
                            "description": r.description, "paths": list(r.extra[key])})
    return out


def infer_direction(records: list[LedgerRecord]) -> str:
    """'min' or 'max' from the ledger itself: a kept change that raised the metric means
    higher is better. Ties and an empty ledger: 'min' (val_bpb)."""
    for r, ref in zip(records, best_before(records), strict=True):
        if (r.status == "keep" and r.kind != "baseline" and r.metric is not None and ref is not None
                and not is_noise_sample(r)):
            if r.metric > ref:
                return "max"
            if r.metric < ref:
                return "min"
    return "min"


def pending_next(records: list[LedgerRecord]) -> list[LedgerRecord]:
    """Records whose decision asked for a confirmation, a replay or a promotion to the full
    budget that never ran: the last
    record of their trial. A kill came between the decision and the next run, or the night
    was stopped (Ctrl-C, ``autoloop stop``) right after the decision."""
    last: dict[int, LedgerRecord] = {}
    for r in records:
        last[r.trial] = r
    return [r for r in last.values() if r.next in ("confirm", "replay", "promote")]


# Recovery's reason for an attempt a kill cut off (engine/recovery.py); in these phases the
# device time was spent and nothing judged, so --resume runs it again (rerun_interrupted).
RERUN_PHASES = ("running", "judging")


def interrupted_in_training(record: LedgerRecord) -> bool:
    return record.status == "crash" and (record.reason or "").startswith(
        tuple(f"interrupted (orchestrator stopped during {phase})" for phase in RERUN_PHASES))


def pending_reruns(records: list[LedgerRecord]) -> list[LedgerRecord]:
    """The last records of their trials that say a kill interrupted them while training,
    where that happened once in the trial (so a re-run is made once: a re-run interrupted
    too stays as it is) and there is a commit to run again. Trials of candidates, fixes and
    confirmations; not the baseline (the start runs a missing baseline anyway) nor verify."""
    last: dict[int, LedgerRecord] = {}
    count: dict[int, int] = {}
    for r in records:
        last[r.trial] = r
        count[r.trial] = count.get(r.trial, 0) + interrupted_in_training(r)
    return [r for r in last.values() if interrupted_in_training(r) and count[r.trial] == 1 and r.commit
            and r.kind in ("candidate", "fix", "confirm", "scout") and not _runs_its_parent(r)]


def _runs_its_parent(record: LedgerRecord) -> bool:
    """A noise sample, as recovery records one a kill cut off (no decision, so no
    ``noise_samples`` in its extra): kind confirm on its own parent. No decision asked for it,
    so nothing is taken up again; the noise is estimated from the samples that finished
    (``--remeasure`` takes new ones)."""
    return record.kind == "confirm" and record.commit is not None and record.commit == record.parent


def replays_of(records: list[LedgerRecord], trial: int) -> int:
    """How often the change of a trial was sent to be replayed on a new best."""
    return sum(1 for r in records if r.trial == trial and r.next == "replay")


@dataclass(frozen=True)
class AgentSpend:
    """What the night's agent calls cost, as their CLIs reported it (never estimated)."""

    calls: int                  # agent calls that ran (each record with extra.agent_usage)
    cost_usd: float             # the sum of the costs reported
    input_tokens: int
    output_tokens: int
    unreported: int             # calls whose output reported nothing at all
    without_cost: int           # calls that reported tokens but no cost (codex)


def agent_spend(records: list[LedgerRecord]) -> AgentSpend:
    """The totals over the records of agent calls (a call is recorded once: its candidate,
    fix or skip; confirmations and replays carry no usage of their own)."""
    calls = tokens_in = tokens_out = unreported = without_cost = 0
    cost: float = 0
    for r in records:
        if "agent_usage" not in r.extra:
            continue
        calls += 1
        usage = r.extra["agent_usage"] or {}
        if not usage:
            unreported += 1
            continue
        if usage.get("cost_usd") is None:
            without_cost += 1
        cost += usage.get("cost_usd") or 0.0
        tokens_in += usage.get("input_tokens") or 0
        tokens_out += usage.get("output_tokens") or 0
    return AgentSpend(calls, cost, tokens_in, tokens_out, unreported, without_cost)


class Pipeline(NamedTuple):
    """How well the proposer kept the device fed (what the look-ahead is for), over the attempts
    since a moment."""

    busy_s: float            # wall time during which an attempt was running (overlaps counted once)
    span_s: float            # from the moment to the last attempt's end
    trials: int              # trials with at least one attempt that ran
    propose_s: float | None  # the proposer's mean time per trial (its calls summed per trial)

    @property
    def busy_share(self) -> float | None:
        return self.busy_s / self.span_s if self.span_s > 0 else None


def pipeline(records: list[LedgerRecord], since: float) -> Pipeline | None:
    """Device-busy time and proposer time of the trials after ``since`` (a run's start, or
    the baseline's end), None when none ran. Attempts of parallel workers overlap: the
    device share is then the share of wall time during which at least one was running."""
    after = [r for r in records if r.ended_at > since and r.kind != "baseline"]
    ran = sorted((max(r.started_at, since), r.ended_at) for r in after if r.status != "skip")
    if not ran:
        return None
    busy, start, end = 0.0, ran[0][0], ran[0][1]
    for a, b in ran[1:]:
        if a > end:
            busy, start = busy + end - start, a
        end = max(end, b)
    busy += end - start
    span = max(r.ended_at for r in after) - since
    per_trial: dict[int, float] = {}
    for r in after:
        seconds = r.extra.get("propose_seconds")
        if isinstance(seconds, (int, float)):
            per_trial[r.trial] = per_trial.get(r.trial, 0.0) + seconds
    proposed = statistics.mean(per_trial.values()) if per_trial else None
    return Pipeline(busy, span, len({r.trial for r in after if r.status != "skip"}), proposed)
