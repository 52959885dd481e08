"""``autoloop report``: the morning summary ``results/report.md`` and the picture
``results/progress.png`` (drawn by ``plot.py``); ``autoloop status`` is ``status.py``.

Everything here only reads ``results/`` (the ledger, the state file, the result files),
takes no lock and changes nothing but the report files, so it is safe from another shell
while a loop runs.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoloop.core import epochs
from autoloop.core.errors import AutoloopError
from autoloop.core.layout import Layout, branch_name
from autoloop.core.power import MAX_CONFIRMATIONS
from autoloop.observe.console import whole_seconds
from autoloop.review import machine_speed, prune, scout, throughput
from autoloop.review.status import integrity_lines, spend_data, spend_line
from autoloop.review.tradeoffs import guards_section, tradeoffs_section
from autoloop.store import person_notes, queries
from autoloop.store.atomic import atomic_write
from autoloop.store.ledger import Ledger, LedgerRecord, trial_label
from autoloop.store.queries import best_before, is_noise_sample, tampered_attempts
from autoloop.store.state import load_state

if TYPE_CHECKING:
    from autoloop.core.contributions import Estimate
    from autoloop.verification.verify_plan import Summary


class ReportError(AutoloopError):
    """Nothing to report on; the message is one line for the user."""


# ------------------------------------------------------------------------------ small pure helpers

def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


def eval_seconds(results_dir: Path, records: list[LedgerRecord]) -> dict[tuple[int, int], float]:
    """eval_seconds of each attempt from its result file (runs/<trial>-<attempt>.result.json)."""
    out = {}
    for r in records:
        path = Layout(Path(results_dir)).result(r.trial, r.attempt)
        try:
            value = json.loads(path.read_text()).get("eval_seconds")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
            out[(r.trial, r.attempt)] = float(value)
    return out


@dataclass
class TimeSplit:
    span: float            # first started_at -> last ended_at
    training: float
    evaluation: float
    trial_other: float     # trial process wall time minus training and evaluation
    harness: float         # inside attempts, outside the trial process
    between: float         # gaps between records: proposer, and the loop not running
    longest_gap: float
    longest_gap_at: float | None

    @property
    def unaccounted(self) -> float:
        return self.span - (self.training + self.evaluation + self.trial_other + self.harness + self.between)


def time_split(records: list[LedgerRecord], evals: dict[tuple[int, int], float]) -> TimeSplit:
    """Where the wall time went, from the ledger alone (see report_markdown for the wording)."""
    ordered = sorted(records, key=lambda r: (r.started_at, r.ended_at))
    if not ordered:
        return TimeSplit(0, 0, 0, 0, 0, 0, 0, None)
    span = max(r.ended_at for r in ordered) - ordered[0].started_at
    training = evaluation = trial_other = harness = between = 0.0
    longest, longest_at = 0.0, None
    prev_end = None
    for r in ordered:
        wall = max(0.0, r.wall_seconds or 0.0)
        train = min(wall, max(0.0, r.training_seconds or 0.0)) if wall else 0.0
        ev = min(wall - train, evals.get((r.trial, r.attempt), 0.0)) if wall else 0.0
        training += train
        evaluation += ev
        trial_other += wall - train - ev
        harness += max(0.0, queries.attempt_seconds(r) - wall)
        if prev_end is not None:
            gap = max(0.0, r.started_at - prev_end)
            between += gap
            if gap > longest:
                longest, longest_at = gap, prev_end
        prev_end = r.ended_at if prev_end is None else max(prev_end, r.ended_at)
    return TimeSplit(span, training, evaluation, trial_other, harness, between, longest, longest_at)


def _md(text: str | None) -> str:
    """Safe inside a markdown table cell."""
    text = " ".join((text or "-").split())
    return text.replace("|", "\\|") or "-"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "-"


def _clock(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def report_markdown(records: list[LedgerRecord], evals: dict[tuple[int, int], float], *, tag: str | None = None,
                    picture: str | None = "progress.png", picture_note: str | None = None,
                    now: float | None = None, verification: list[str] | None = None,
                    notes: Sequence[dict[str, Any]] = ()) -> str:
    """The whole report.md text for a ledger (pure: everything it needs is passed in).
    ``verification``: the lines of its Verification section, after the kept changes;
    ``notes``: the person's notes and clears (person_notes.history), in order."""
    if not records:
        raise ReportError("the ledger has no records yet: nothing to report")
    metric = records[-1].metric_name
    direction = queries.infer_direction(records)
    baseline = queries.baseline(records)
    kept = kept_changes(records)
    spend = spend_data(records)
    out = header_lines(records, tag, metric, direction, now)
    out += result_section(records, baseline, metric, len(kept))
    out += epochs_lines(records)
    if picture:
        out += [f"![{metric} per attempt]({picture})", ""]
    if picture_note:
        out += [picture_note, ""]
    out += kept_section(kept, metric)
    out += verification or []
    out += notes_section(notes)
    if spend:
        out += ["## Agent cost", "", spend_line(spend) + ".", ""]
    out += proposers_section(records, direction, metric)   # what each proposer brought
    out += attempts_section(records, baseline)
    out += crashes_section(records)
    out += device_time_section(records, baseline)
    out += throughput.throughput_section(records)
    out += integrity_section(records)
    out += noise_section(records, baseline, metric)
    out += scout.report_section(records)
    out += prune.report_section(records)
    out += machine_speed.report_section(records, metric)
    out += guards_section(records) + tradeoffs_section(records, metric, direction)
    out += time_section(time_split(records, evals))
    return "\n".join(out)


def epochs_lines(records: list[LedgerRecord]) -> list[str]:
    """A warning under the result when a run of the night read its training bytes more than once."""
    found = epochs.warning(epochs.most(r.metrics for r in queries.of_night(records)))
    return [f"**Warning:** {found}.", ""] if found else []


def kept_changes(records: list[LedgerRecord]) -> list[tuple[LedgerRecord, float | None]]:
    """The kept changes in the order they were kept, each with the best before it."""
    return [(r, ref) for r, ref in zip(records, best_before(records), strict=True)
            if r.status == "keep" and r.kind != "baseline" and not is_noise_sample(r)]


def header_lines(records: list[LedgerRecord], tag: str | None, metric: str, direction: str,
                 now: float | None) -> list[str]:
    judged = [r for r in records if r.status != "skip"]
    branch = branch_name(tag) if tag else "the autoloop branch"
    first, last = min(r.started_at for r in records), max(r.ended_at for r in records)
    return [f"# autoloop report: {branch}", "",
            f"{len(judged)} attempts of {len({r.trial for r in judged})} trials from {_clock(first)} to "
            f"{_clock(last)} ({whole_seconds(last - first)}); {metric}, {'lower' if direction == 'min' else 'higher'} "
            f"is better. Written {_clock(now or time.time())} from `results/ledger.jsonl`.", ""]


def result_section(records: list[LedgerRecord], baseline: LedgerRecord | None, metric: str,
                   n_kept: int) -> list[str]:
    out = ["## Result", ""]
    if baseline is None or baseline.metric is None:
        return out + ["No baseline has been recorded yet.", ""]
    best_commit, best_metric = queries.best(records)
    base = queries.baseline_estimate(records)
    base_value = base.metric if base else baseline.metric
    runs = (f" (mean of {len(base.runs)} runs, σ {base.sigma:.6f})" if base and len(base.runs) > 1
            and base.sigma is not None else "")
    out += [f"| | {metric} | commit | trial |", "|---|---:|---|---:|",
            f"| baseline | {base_value:.6f}{runs} | `{(baseline.commit or '-')[:7]}` | {baseline.trial} |"]
    best_rec = queries.best_record(records) or baseline
    if best_metric is not None:
        out.append(f"| best | {best_metric:.6f} | `{(best_commit or '-')[:7]}` | {best_rec.trial} |")
        delta = best_metric - base_value
        pct = f" ({100 * delta / base_value:+.2f}%)" if base_value else ""
        out.append(f"| change | {delta:+.6f}{pct} | {n_kept} kept change{'s' if n_kept != 1 else ''} | |")
        base_audit, best_audit = baseline.extra.get("audit_bpb"), best_rec.extra.get("audit_bpb")
        if isinstance(base_audit, (int, float)) and isinstance(best_audit, (int, float)):
            out += ["", f"Held-out audit slice (never used for a decision): baseline {base_audit:.6f}, "
                        f"best {best_audit:.6f} ({best_audit - base_audit:+.6f}). A best that gains on "
                        f"{metric} but not here has over-fitted the validation slice."]
    return out + [""]


def kept_section(kept: list[tuple[LedgerRecord, float | None]], metric: str) -> list[str]:
    out = ["## Kept changes", ""]
    if not kept:
        return out + ["None: no change beat the baseline.", ""]
    out += ["In the order they were kept; each delta is against the best before it.", "",
            f"| # | trial | commit | {metric} | delta | confidence | description | hypothesis |",
            "|---:|---:|---|---:|---:|---:|---|---|"]
    for i, (r, ref) in enumerate(kept, 1):
        delta = f"{r.metric - ref:+.6f}" if r.metric is not None and ref is not None else "-"
        parents = (r.extra.get("combine") or {}).get("parents")   # proposers/combine.py
        joined = (" (combines trials " + " + ".join(f"#{p}" for p in parents if isinstance(p, int)) + ")"
                  if isinstance(parents, list) else "")
        out.append(f"| {i} | {trial_label(r.trial, r.attempt)} | `{(r.commit or '-')[:7]}` | "
                   f"{_fmt(r.metric, 6)} | {delta} | "
                   f"{'-' if r.confidence is None else f'{r.confidence:.1f}σ'} | {_md(r.description)}{joined} | "
                   f"{_md(r.extra.get('hypothesis') or '-')} |")
    weak = queries.under_powered_keeps([r for r, _ in kept])
    if weak:
        out += ["", "**Under-powered**: kept on fewer runs than `--power` asked for (the confirmation's count was "
                f"capped at {MAX_CONFIRMATIONS} more runs): "
                + ", ".join(queries.under_powered_text(r, c) for r, c in weak)
                + ". Their gain is less sure than the others'; `autoloop verify` measures it again."]
    return out + [""]


# How the report names the groups of queries.attempt_counts (n -> words).
REPORT_COUNT_WORDS = {"baseline": ("baseline run", "baseline runs"), "noise_sample": ("noise sample", "noise samples"),
                      "keep": ("kept change", "kept changes"),
                      "confirm": ("re-run (confirmation or replay) not kept", "re-runs (confirmations or replays) "
                                  "not kept"),
                      "discard": ("discarded", "discarded"), "crash": ("crashed", "crashed"),
                      "pruned": ("pruned behind the best's curve", "pruned behind the best's curve")}


def attempts_section(records: list[LedgerRecord], baseline: LedgerRecord | None) -> list[str]:
    counts = queries.attempt_counts(records)
    skips = [r for r in records if r.status == "skip"]
    parts = [f"{n} {REPORT_COUNT_WORDS[k][n != 1]}" for k, n in counts.items() if k in REPORT_COUNT_WORDS]
    line = ", ".join(parts) or "none"
    if skips:
        line += f"; {len(skips)} proposal{'s' if len(skips) != 1 else ''} skipped before anything ran"
    out = ["## Attempts", "", line + ".", ""]
    if skips:
        reasons = Counter(" ".join(r.reason.split())[:120] or "-" for r in skips)
        out += ["Skipped proposals:", ""]
        out += [f"- {n} x {_md(reason)}" for reason, n in reasons.most_common()]
        out.append("")
    return out


# What each crash class means, in the Crashes section; other classes are listed after these.
CRASH_MEANING = {"trivial": "the edit was broken; sent back to the proposer to fix",
                 "fundamental": "the idea failed (out of memory, NaN, a signal, interrupted)",
                 "timeout": "ran past the hard limit; the process tree was killed"}


def crashes_section(records: list[LedgerRecord]) -> list[str]:
    crashes = [r for r in records if r.status == "crash"]
    out = ["## Crashes", ""]
    ended = queries.cluster_ended(records)
    if ended:
        gave_up = [r for r in records if r.status == "ended"]
        past = (f"; {len(gave_up)} trial(s) the cluster kept ending past their retries are recorded as ended "
                f"({', '.join(f'#{r.trial}' for r in gave_up[-5:])})" if gave_up else "")
        out += [f"The cluster ended {ended} job(s) (preempted, node failure, lost, queue limit); each trial was "
                f"submitted again{past}, and none is counted against its change.", ""]
    if not crashes:
        return out + ["None.", ""]
    by_class: dict[str, list[LedgerRecord]] = {}
    for r in crashes:
        by_class.setdefault(r.crash or "fundamental", []).append(r)
    for cls in (*CRASH_MEANING, *sorted(set(by_class) - set(CRASH_MEANING))):
        if cls not in by_class:
            continue
        group = by_class[cls]
        out += [f"### {cls} ({len(group)})", ""]
        if cls in CRASH_MEANING:
            out += [f"_{CRASH_MEANING[cls]}._", ""]
        for r in group:
            out.append(f"- #{trial_label(r.trial, r.attempt)} {_md(r.description)}: {_md(r.reason)}"
                       + (f" (log `results/{r.log_path}`)" if r.log_path else ""))
        out.append("")
    return out


def device_time_section(records: list[LedgerRecord], baseline: LedgerRecord | None) -> list[str]:
    """The share of the night a trial was running, and what the proposer cost per trial."""
    fed = queries.pipeline(records, baseline.ended_at) if baseline is not None else None
    if fed is None or fed.busy_share is None:
        return []
    return ["## Device time", "",
            f"A trial was running {_pct(fed.busy_s, fed.span_s)} of the {whole_seconds(fed.span_s)} from the end "
            f"of the baseline to the last attempt ({fed.trials} trials; the time between runs of a resumed "
            "night counts as idle)."
            + (f" The proposer took {fed.propose_s:.1f} s per trial on average; with look-ahead "
               "(`--lookahead 1`) that time overlaps the training of the trial before." if fed.propose_s is not None
               else ""), ""]


def integrity_section(records: list[LedgerRecord]) -> list[str]:
    out = ["## Integrity", ""]
    tampered = tampered_attempts(records)
    if not tampered:
        return out + ["No attempt changed the harness, `program.md` or the prepared data.", ""]
    out += [f"**{len(tampered)} attempt{'s' if len(tampered) != 1 else ''} changed an input of the measurement** "
            "(the harness, `program.md` or the prepared data). Each was restored from "
            "`results/.pristine/`; the changed versions are in `results/quarantine/<trial>-<attempt>-tampered/`. "
            "Found during an attempt: that attempt is invalid (crash). Found before a run: a proposer made the "
            "change, and the run, made on the restored inputs, stood.", ""]
    for t in tampered:
        out.append(f"- #{trial_label(t['trial'], t['attempt'])} {_md(t['description'])} ({t['when']} the "
                   f"{'attempt' if t['when'] == 'during' else 'run'}, {t['status']}): "
                   + ", ".join(f"`{p}`" for p in t["paths"]))
    return out + [""]


def noise_section(records: list[LedgerRecord], baseline: LedgerRecord | None, metric: str) -> list[str]:
    out = ["## Noise", ""]
    noisy = [r for r in records if r.noise is not None and math.isfinite(r.noise)]
    if not noisy:
        return out + ["No record carries a noise estimate (no repeated runs of one commit were made), so "
                      "small deltas may be noise.", ""]
    latest = noisy[-1]
    values = [r.noise for r in noisy if r.noise is not None]   # all of them: narrowed for the type checker
    latest_noise = values[-1]
    spread = f", ranging {min(values):.6f} to {max(values):.6f}" if min(values) != max(values) else ""
    out.append(f"Noise estimate (the run-to-run spread of {metric} that the decisions allowed for): "
               f"{latest_noise:.6f} as of trial {trial_label(latest.trial, latest.attempt)}; "
               f"{len(noisy)} record{'s' if len(noisy) != 1 else ''} carry one{spread}.")
    _, best_metric = queries.best(records)
    base = queries.baseline_estimate(records)
    if best_metric is not None and base is not None and latest_noise > 0:
        out.append(f"The total change, {best_metric - base.metric:+.6f}, is "
                   f"{abs(best_metric - base.metric) / latest_noise:.1f} times that estimate.")
    return out + [""]


# The rows of "Where the time went": the TimeSplit field and how it is computed.
TIME_ROWS = (
    ("training", "training",
     "sum of `training_seconds` that train.py reported (the timed training loop)"),
    ("evaluation", "evaluation",
     "sum of `eval_seconds` in `results/runs/<trial>-<attempt>.result.json`, where the file exists"),
    ("trial start-up and the rest", "trial_other",
     "trial process wall time (`wall_seconds`) minus the two rows above: interpreter start-up, imports, data "
     "loading, compilation and warm-up steps, and all of a crashed trial's time"),
    ("harness within attempts", "harness",
     "attempt time (`elapsed_s`, else `started_at` to `ended_at`) minus the trial process: commit, git, judging, "
     "ledger"),
    ("proposer and between attempts", "between",
     "gaps from one record's `ended_at` to the next one's `started_at`: the proposer (agent, mutator, queue), "
     "the scope check, and any time no loop was running"),
)


def time_section(split: TimeSplit) -> list[str]:
    s = split.span
    out = ["## Where the time went", "",
           "| | time | share | how it is computed |", "|---|---:|---:|---|"]
    for name, attribute, how in TIME_ROWS:
        value = getattr(split, attribute)
        out.append(f"| {name} | {whole_seconds(value)} | {_pct(value, s)} | {how} |")
    if abs(split.unaccounted) >= 1:
        gap = abs(split.unaccounted)
        out.append(f"| overlap / unaccounted | {whole_seconds(gap)} | {_pct(gap, s)} | "
                   "the span minus the rows above (records that overlap in time: parallel writers) |")
    out.append(f"| **total** | **{whole_seconds(s)}** | 100% | "
               "first record's `started_at` to the last record's `ended_at` |")
    out.append("")
    if split.longest_gap >= 1800:
        out += [f"The longest gap between two attempts, {whole_seconds(split.longest_gap)} from "
                f"{_clock(split.longest_gap_at)}, is probably time when no loop was running; it is counted "
                "in the last row.", ""]
    return out


_HOLDS = {True: "holds", False: "does not hold", None: "-"}


def verification_section(summary: Summary, picture: str | None, picture_note: str | None = None) -> list[str]:
    """'## Verification': each kept change's contribution with its interval, whether
    it holds at scale, from ``verify_plan.summarize``; how the numbers are made, in a line."""
    from autoloop.verification.verify_plan import scale_text, under_powered, variant_label

    plan = summary.plan
    out = ["## Verification", "",
           f"`autoloop verify` ran the best `{plan.best[:7]}`, the baseline `{plan.baseline[:7]}` and the best with "
           f"each kept change taken out, {plan.repeats} times each with new seeds ({plan.seeds[0]}..{plan.seeds[-1]}). "
           "A change's contribution is the mean over those seeds of how much worse the best is without it (positive: "
           "it helps), with a 95% t-interval; *within noise* means the interval contains zero: the runs cannot tell "
           "the change from no change (`autoloop finalize --drop-unproven` leaves those out)."]
    if plan.transfer_planned:
        out[-1] += (f" At scale ({scale_text(plan)}) the baseline, the best and the best without each confirmed change "
                    "ran again; a gain holds there when its interval at scale stays above zero.")
    out += ["", "| change | contribution (95% interval) | verdict | at scale | holds at scale |",
            "|---|---:|---|---:|---|"]
    gain_scale = summary.gain_at_scale
    ratio = f" ({summary.ratio:.2f} x)" if summary.ratio is not None else ""
    out.append(f"| **the best vs the baseline** | {summary.gain.text() if summary.gain else '-'} | "
               f"{summary.gain.verdict if summary.gain else '-'} | "
               f"{(gain_scale.text() + ratio) if gain_scale else '-'} | "
               f"{_HOLDS[None if gain_scale is None else gain_scale.verdict == 'confirmed']} |")
    for c in summary.changes:
        what = f"{variant_label(list(c.trials))} {_md(c.description)}"
        if c.revert in ("conflict", "absent"):
            why = "does not revert cleanly on the best" if c.revert == "conflict" else "no longer in the best"
            out.append(f"| {what} | - | not measured: {why} | - | - |")
            continue
        est = c.estimate
        out.append(f"| {what}{' (grouped)' if c.revert == 'grouped' else ''} | {est.text() if est else '-'} | "
                   f"{est.verdict if est else 'not run'} | {c.at_scale.text() if c.at_scale else '-'} | "
                   f"{_HOLDS[c.holds]} |")
    out += machine_speed.verification_lines(summary)
    weak = under_powered(plan)
    if weak:
        out += ["", f"**Under-powered** at {plan.repeats} repeats (the night's σ {plan.sigma:.4g}; "
                f"{plan.power:.0%} power asked at a two-sided 5%): "
                + ", ".join(f"#{t} (its gain {g:.4g} is seen with power {pw:.0%}; it needs {min(n, 999)} repeats)"
                            for t, g, pw, n in weak)
                + ". A *within noise* verdict there says little about the change."]
    if plan.repeats_why:
        out += ["", f"Repeats: {plan.repeats_why}."]
    if summary.left:
        out += ["", f"_{summary.left} run(s) are not done yet: `autoloop verify --resume` runs them._"]
    out.append("")
    if picture:
        out += [f"![contributions]({picture})", ""]
    if picture_note:
        out += [picture_note, ""]
    return out


def notes_section(notes: Sequence[dict[str, Any]]) -> list[str]:
    """'## Notes from the person': every `autoloop note` and `--clear`, with its time."""
    if not notes:
        return []
    out = ["## Notes from the person", "",
           "What `autoloop note` told the agent; every prompt after a note carried it until it was cleared.", ""]
    for event in notes:
        when = _clock(event["at"])
        if event.get("clear"):
            out.append(f"- {when}: {'pinned lessons' if event.get('pinned') else 'notes'} cleared")
        else:
            out.append(f"- {when}: {'(pinned) ' if event.get('pinned') else ''}{_md(event['note'])}")
    return out + [""]


def proposers_section(records: list[LedgerRecord], direction: str, metric: str) -> list[str]:
    """'## Proposers': what each proposer brought (a portfolio's members one by one)."""
    from autoloop.proposers.outcomes import proposer_yields

    yields = proposer_yields(records, direction)
    if not yields:
        return []
    sign = -1 if direction == "min" else 1
    digits = 6 if any(0 < y.gain < 0.0005 for y in yields.values()) else 4

    def change(gain: float) -> str:   # the metric's change, "0" rather than "-0.0000"
        return f"{sign * gain:+.{digits}f}" if gain else "0"

    summary = "; ".join(f"{name}: {y.keeps} keep{'s' if y.keeps != 1 else ''} in {y.trials} trial"
                        f"{'s' if y.trials != 1 else ''}, {change(y.gain)}" for name, y in yields.items())
    out = ["## Proposers", "", f"{summary}.", "",
           "Trials count failed proposals too; keeps are the trials that moved the best, and the change is how "
           "far they moved it. Time is each trial's attempts plus, in a portfolio, its proposing time.", "",
           f"| proposer | trials | keeps | failed to propose | {metric} change | time | change per hour |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for name, y in yields.items():
        rate = change(y.gain * 3600 / y.seconds) if y.seconds > 0 else "-"
        out.append(f"| {_md(name)} | {y.trials} | {y.keeps} | {y.failed} | {change(y.gain)} | "
                   f"{whole_seconds(y.seconds)} | {rate} |")
    return out + [""]


def ladder_lines(results: Layout, output: Layout, records: list[LedgerRecord], tag: str | None) -> list[str]:
    from autoloop.review.ladder_report import ladder_lines as lines

    return lines(results, output, records, tag)


def verification_lines(results: Layout, output: Layout, records: list[LedgerRecord], tag: str | None) -> list[str]:
    """The Verification section and its picture, when this tag has a verification plan."""
    from autoloop.review import plot
    from autoloop.verification.verify_plan import load_plan, summarize, variant_label

    plan = load_plan(results)
    if plan is None or (tag and plan.tag != tag):
        return []
    summary = summarize(plan, records)
    rows: list[tuple[str, Estimate | None, Estimate | None]] = [
        ("the best vs the baseline", summary.gain, summary.gain_at_scale)]
    rows += [(f"{variant_label(list(c.trials))} {c.description}", c.estimate, c.at_scale) for c in summary.changes]
    picture = output.contributions_picture
    try:
        picture.parent.mkdir(parents=True, exist_ok=True)
        plot.write_contributions_png(rows, picture, metric=records[-1].metric_name,
                                     title=f"what each kept change is worth ({plan.repeats} repeats)")
        return verification_section(summary, picture.relative_to(output.root).as_posix())
    except plot.PlotUnavailable as e:
        return verification_section(summary, None, f"_No picture: {e}._")


@dataclass
class ReportFiles:
    markdown: Path
    picture: Path | None
    note: str | None      # why there is no picture, when there is none
    records: list[LedgerRecord] = field(default_factory=list)   # what it covered: report --since-last's start
    tag: str | None = None
    not_ours: list[str] = field(default_factory=list)   # integrity_lines: printed by `autoloop report` too


def study_lines(results: Layout, output: Layout) -> list[str]:
    """The study across nights (history.py), with its picture; nothing for a single night."""
    from autoloop.review import plot
    from autoloop.review.history import history_payload, history_section

    payload = history_payload(results.root)
    if len(payload["nights"]) < 2:
        return []
    try:
        picture = plot.write_study_png(payload["nights"], output.study_picture, metric=payload["metric"] or "metric")
    except plot.PlotUnavailable:
        return history_section(payload)
    return history_section(payload, picture.relative_to(output.root).as_posix())


def write_report(results_dir: Path, output_dir: Path | None = None, tag: str | None = None) -> ReportFiles:
    """Write report.md and progress.png for the ledger in ``results_dir`` into ``output_dir``
    (default: ``results_dir``)."""
    results = Layout(Path(results_dir))
    output = Layout(Path(output_dir)) if output_dir else results
    if not results.ledger.exists():
        raise ReportError(f"no ledger at {results.ledger}: nothing to report (run autoloop run first)")
    records = Ledger(results.root).records()
    if not records:
        raise ReportError(f"{results.ledger} has no records yet: nothing to report")
    tag = tag or load_state(results.root).tag
    output.ensure()

    from autoloop.review import plot

    # The night's search is what the counts, tables and the progress picture show; the
    # verification's runs (kind verify) have a section of their own.
    night = queries.of_night(records)
    picture: Path | None = output.picture
    note: str | None = None
    try:
        plot.write_progress_png(night, output.picture, tag=tag)
    except plot.PlotUnavailable as e:
        picture, note = None, str(e)
    text = report_markdown(night, eval_seconds(results.root, night), tag=tag,
                           picture=picture.name if picture else None,
                           picture_note=f"_No picture: {note}._" if note else None,
                           verification=verification_lines(results, output, records, tag)
                           + ladder_lines(results, output, records, tag),
                           notes=person_notes.history(results.root))
    text += "\n" + "\n".join(study_lines(results, output))
    found = integrity_lines(results.root)
    if found:   # first thing on the page: these records are not counted anywhere below
        text = "\n".join(["## Records autoloop did not write", "", *[f"- {line}" for line in found], "", text])
    atomic_write(output.report, text + "\n")
    return ReportFiles(output.report, picture, note, records, tag, found)
