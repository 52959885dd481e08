"""Which ledger appends are events worth telling someone who is asleep (core/night_events.py).

:class:`EventWatch` is fed every record the arbiter appends, after being primed with the
ledger as it stood at the start (a resumed night does not announce its old best again),
and says:

* ``new_best``: the best moved to another commit (not the baseline): its Δ against the
  best before, its confidence in noise sigmas and its description;
* ``crash_streak``: ``STREAK`` judged attempts in a row crashed (once per streak);
* ``proposer_failures``: ``STREAK`` failed proposals in a row (skips; duplicates aside),
  the agent's own cause named (auth, quota, missing binary, timeout).

:func:`ending_events` makes the events of the stop: ``low_disk`` or ``stopped_by_error``
when that is why it stopped, and ``night_end`` with the night's summary always.
"""

from __future__ import annotations

from autoloop.core.night_events import STREAK, NightEvent, failure_cause, safe_text
from autoloop.observe.console import metric_digits, plural
from autoloop.store import queries
from autoloop.store.ledger import LedgerRecord, trial_label


class EventWatch:
    def __init__(self, tag: str, records: list[LedgerRecord]):
        self.tag = tag
        self.best: str | None = None
        self.best_metric: float | None = None
        self.crashes = 0
        self.failures: list[LedgerRecord] = []
        for record in records:
            self._track(record)
        self.crashes, self.failures = 0, []   # a streak is told within one start

    def _track(self, record: LedgerRecord) -> tuple[str | None, float | None]:
        before = self.best, self.best_metric
        if record.best is not None:
            self.best, self.best_metric = record.best, record.best_metric
        if record.status == "skip":
            if "duplicate_of" not in record.extra:
                self.failures.append(record)
        else:
            self.failures = []
            self.crashes = self.crashes + 1 if record.status == "crash" else 0
        return before

    def recorded(self, record: LedgerRecord) -> list[NightEvent]:
        (was, was_metric) = self._track(record)
        events = []
        if record.kind != "baseline" and record.best and was and record.best != was:
            events.append(self._new_best(record, was_metric))
        if self.crashes == STREAK and record.status == "crash":
            events.append(NightEvent(
                "crash_streak", self.tag, f"autoloop {self.tag}: {STREAK} crashes in a row",
                f"the last: #{trial_label(record.trial, record.attempt)} {record.crash or 'crash'}: "
                f"{safe_text(record.reason)}",
                {"count": STREAK, "trial": record.trial, "attempt": record.attempt, "crash": record.crash,
                 "reason": safe_text(record.reason)}))
        if len(self.failures) == STREAK and record.status == "skip":
            causes = [failure_cause(r.reason) for r in self.failures]
            cause = max(set(causes), key=causes.count) if causes else "other"
            events.append(NightEvent(
                "proposer_failures", self.tag,
                f"autoloop {self.tag}: the proposer failed {STREAK} times in a row ({cause})",
                f"{record.proposer}: {safe_text(record.reason)}",
                {"count": STREAK, "proposer": record.proposer, "cause": cause, "reason": safe_text(record.reason)}))
        return events

    def _new_best(self, record: LedgerRecord, was: float | None) -> NightEvent:
        now = record.best_metric
        delta = now - was if now is not None and was is not None else None
        digits = metric_digits(delta)
        said_delta = f"{delta:+.{digits}f}" if delta is not None else "?"
        conf = f", {record.confidence:.1f}σ" if record.confidence is not None else ""
        description = safe_text(record.description)
        return NightEvent(
            "new_best", self.tag,
            f"autoloop {self.tag}: new best {record.metric_name} "
            f"{now if now is None else f'{now:.{digits}f}'} ({said_delta}{conf})",
            f"#{trial_label(record.trial, record.attempt)} {description}",
            {"trial": record.trial, "attempt": record.attempt, "commit": record.best, "metric_name": record.metric_name,
             "metric": now, "before": was, "delta": delta, "confidence": record.confidence,
             "description": description})


def ending_events(tag: str, reason: str | None, error: BaseException | None,
                  records: list[LedgerRecord]) -> list[NightEvent]:
    """The events of the night's stop: its cause when it is one to tell, then its summary."""
    reason = reason or ("stopped by an error" if error is not None else "stopped")
    events = []
    if error is not None or reason.startswith(("the loop failed", "a worker failed")):
        said = safe_text(f"{type(error).__name__}: {error}" if error is not None else reason)
        events.append(NightEvent("stopped_by_error", tag, f"autoloop {tag}: stopped by an error", said,
                                 {"reason": said}))
    elif reason.startswith("low disk"):
        events.append(NightEvent("low_disk", tag, f"autoloop {tag}: stopped, low disk", safe_text(reason),
                                 {"reason": safe_text(reason)}))
    night = queries.of_night(records)
    counts = queries.attempt_counts(night)
    baseline = queries.baseline(records)
    best = queries.best_record(records)
    metric = best.metric_name if best else "val_bpb"
    digits = 4
    judged = [r for r in night if r.status != "skip"]
    keeps = sum(1 for r in night if queries.is_kept_change(r))
    crashes = sum(1 for r in judged if r.status == "crash")
    start = baseline.best_metric if baseline else None
    end = best.best_metric if best else None
    if start is not None and end is not None:
        digits = metric_digits(end - start)
        moved = f"{metric} {start:.{digits}f} -> {end:.{digits}f} ({end - start:+.{digits}f})"
    else:
        moved = f"{metric} {'-' if end is None else f'{end:.{digits}f}'}"
    text = (f"{moved}; {plural(len(judged), 'attempt')}, {plural(keeps, 'kept change')}, "
            f"{plural(crashes, 'crash', 'crashes')}; {safe_text(reason)}")
    events.append(NightEvent("night_end", tag, f"autoloop {tag}: the night ended", text,
                             {"reason": safe_text(reason), "attempts": len(judged), "kept": keeps, "crashes": crashes,
                              "baseline": start, "best": end, "best_commit": best.best if best else None,
                              "metric_name": metric, "counts": counts}))
    return events
