"""The results ledger: append-only ledger.jsonl (source of truth) and results.tsv derived from it.

Files, all under the workspace's ``results/``:

``ledger.jsonl``
    One JSON object per line, one line per trial *attempt*, each a validated
    :class:`LedgerRecord`. Appended only: a line is written with a single
    ``os.write`` on an ``O_APPEND`` descriptor, then fsync'ed, while holding the lock
    below, so concurrent writers (parallel workers, a second process) never interleave
    or lose records. Non-finite floats are stored as the strings ``"NaN"``,
    ``"Infinity"``, ``"-Infinity"`` so every line stays strict JSON.

``.ledger.lock``
    A filelock lock file serialising appends and TSV rewrites. It only guards the
    ledger; refusing a second orchestrator is the workspace's job.

``results.tsv``
    Derived, never edited in place: rewritten from the whole ledger after every
    append (temp file in the same folder, fsync, ``os.replace``), so readers see the
    old or the new file, never half of one. Columns (``TSV_COLUMNS``)::

        commit  val_bpb  memory_gb  status  description  crash  trial  seconds  confidence  worker  hypothesis

    The first five are exactly karpathy/autoresearch's, so its tools keep working.
    ``commit``: short 7-char sha, ``-`` when nothing was committed.
    ``val_bpb``: the configured metric (the header stays ``val_bpb`` for
    compatibility), ``%.6f``; crashed rows and rows without a metric ``0.000000``.
    ``memory_gb``: ``%.1f``; crashed rows ``0.0``.
    ``status``: ``keep``, ``discard`` or ``crash``.
    ``description``: tabs, newlines and other line breaks become spaces and double
    quotes become single quotes (so csv/pandas readers never see a quoted field);
    the ledger keeps the original text. Empty -> ``-``.
    ``crash``: ``trivial``, ``fundamental``, ``timeout`` or ``-``.
    ``trial``: ``<trial>`` for attempt 1, ``<trial>.<attempt>`` for later attempts of
    the same trial (fixes of a trivial crash, confirmation re-runs): ``7``, ``7.2``,
    ``7.3``. Read it as a string, not a float (``7.10`` is attempt 10).
    ``seconds``: training seconds ``%.1f``, wall seconds when the trial reported
    none; crashed rows ``0.0``.
    ``confidence``: the improvement over the best in units of the noise estimate
    (``3.2`` = 3.2 sigma better, negative = worse), ``%.1f``; ``-`` when there is no
    noise estimate or nothing to compare with (baseline, noise samples, crashes).
    Records of kind ``verify`` (``autoloop verify``) are not in results.tsv either.

    ``worker``: the parallel worker that ran the attempt (``autoloop run --workers N``:
    ``0``..``N-1``); ``-`` for the single loop, the baseline and its noise samples.
    ``hypothesis``: the agent's one line on why the change should help
    (``$AUTOLOOP_HYPOTHESIS_FILE``, kept in the record's ``extra.hypothesis``), made
    TSV-safe like the description; ``-`` when none was given. Always the last column:
    readers of the first ten keep working.

    Records with status ``skip`` (a proposal that failed before anything ran) or
    ``ended`` (the cluster ended the trial's job past its retries: nothing measured,
    nothing judged) are in the ledger but NOT in results.tsv, whose status column is
    only keep/discard/crash.

Damage:

* A torn tail (power loss mid-append): an unterminated last fragment, or final
  line(s) that are not JSON at all, after the last good record. :meth:`Ledger.repair`
  (call it on start) moves those bytes to ``results/ledger.torn-<timestamp>`` (never
  silently dropped) and truncates the ledger to the last good newline.
  :meth:`Ledger.records` ignores a torn tail; :meth:`Ledger.append` repairs one
  itself before writing so a new record is never glued onto a fragment.
* Anything bad with a good record after it, or a line that is valid JSON but not a
  valid record (anywhere), is not what a power loss leaves: :class:`LedgerError`
  naming the line number; nothing is dropped and the user must look.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

from filelock import FileLock, Timeout
from pydantic import BaseModel, ConfigDict, Field, SkipValidation, ValidationError
from typing_extensions import TypedDict

from autoloop.core.classify import CrashClass
from autoloop.core.errors import AutoloopError
from autoloop.core.layout import Layout
from autoloop.store import chain
from autoloop.store.atomic import atomic_write, fault_write, fsync_dir

# skip: proposal failed, nothing was run; ended: the cluster ended the trial (past its retries), no verdict;
# pruned: stopped early behind the best's curve (--prune)
Status = Literal["keep", "discard", "crash", "skip", "ended", "pruned"]
# What an attempt was: the unmodified baseline, a new idea, a fix of a trivial crash,
# a re-run of an earlier candidate (noise confirmation, replay), or a run of
# `autoloop verify` (verify.py: never judged against the best, never moving it), or a run at
# the scout budget (--scout, core/scout.py: never a keep).
AttemptKind = Literal["baseline", "candidate", "fix", "confirm", "verify", "scout"]
Fidelity = Literal["scout", "full"]

TSV_COLUMNS = ["commit", "val_bpb", "memory_gb", "status", "description", "crash", "trial", "seconds",
               "confidence", "worker", "hypothesis"]



class LedgerError(AutoloopError):
    """The ledger cannot be read or written safely; the message is one line for the user."""


class LedgerRecord(BaseModel):
    # "strings": NaN/inf become "NaN"/"Infinity" - strict JSON that validates back to floats.
    model_config = ConfigDict(ser_json_inf_nan="strings")

    trial: int
    attempt: int = 1
    kind: AttemptKind = "candidate"
    started_at: float
    ended_at: float
    # The attempt's seconds on the monotonic clock (None: written before it, or an attempt a
    # kill cut off); durations read it, never ended_at - started_at (queries.attempt_seconds).
    elapsed_s: float | None = None
    proposer: str
    parent: str | None = None          # the best commit the candidate was built on
    commit: str | None = None          # the candidate commit (None when nothing was committed)
    description: str
    status: Status
    crash: CrashClass | None = None
    reason: str = ""                   # one line: why this status (crash evidence, "within noise", ...)
    metric_name: str = "val_bpb"
    metric: float | None = None
    memory_gb: float = 0.0
    training_seconds: float | None = None
    total_seconds: float | None = None
    wall_seconds: float = 0.0          # wall time of the trial process
    exit_code: int | None = None
    signal: int | None = None
    diff_lines: int = 0                # lines added + removed in the target
    seed: int | None = None
    fingerprint: str | None = None     # data fingerprint from the result file
    noise: float | None = None         # noise estimate in force when judged
    confidence: float | None = None    # improvement over the best / noise, in sigma
    log_path: str | None = None
    best: str | None = None            # best commit after this record's decision
    best_metric: float | None = None   # best metric after this record's decision
    outside_changes: list[str] = Field(default_factory=list)  # files reverted by the scope check
    # Facts about the attempt; the engine never reads control flow here.
    extra: dict[str, Any] = Field(default_factory=dict)
    worker: int | None = None          # parallel worker that ran it; None: the single loop
    # What the decision asked for next in this trial: "confirm" (the same commit once more,
    # another seed) or "replay" (its change merged onto a best another worker set); None:
    # the decision was final. A record of what was decided; read back only by the next start,
    # for a step decided and never run (queries.pending_next).
    next: Literal["confirm", "replay", "promote"] | None = None
    # The hash chain (chain.py): written as the line's last key, checked on every read.
    chain: str | None = Field(default=None, exclude=True)   # read from the line; never dumped
    # Every `NAME: value` line the trial printed (finite numbers): the secondary metrics that
    # --guard reads and the morning's trade-offs plot. Empty in ledgers written before it.
    metrics: dict[str, float] = Field(default_factory=dict)
    # Throughput of the trial (train.py's summary): ranks it ran on (torch.distributed.run),
    # tokens per second over all ranks, and MFU against the ranks' dense bf16 peak (None:
    # not reported, or a device with no known peak).
    world_size: int = 1
    tokens_per_s: float | None = None
    mfu_percent: float | None = None
    # The budget the run trained for: "scout" (--scout's short rung) or "full" (--budget);
    # ledgers written before the scout rung have only full runs.
    fidelity: Fidelity = "full"
    # The machine's speed beside the run (execution/machine_speed.py; its parts in
    # extra.machine): what store/machine_speed.py fits the metric's dependence on. None: not measured.
    machine_speed: float | None = None


class Extra(TypedDict, total=False):
    """The keys that travel in a record's ``extra`` from one layer to another: who writes
    them is named beside each. Facts, never control flow. A record read back from an old
    ledger may hold others (LedgerRecord.extra stays an open dict); a new key goes here."""

    # the proposal (proposers, engine/candidate.py, engine/trial.py, engine/lookahead.py)
    source: str                          # where the change came from (a patch file, an agent's log)
    git_events: list[str]                # what reconcile undid of the proposer's git
    replay_of: str                       # the commit whose change this is, replayed on a new best
    hypothesis: str                      # the agent's why (carried to the trial's re-runs)
    agent_usage: dict[str, Any] | None   # what the agent call cost, as its CLI said (usage.py)
    portfolio: dict[str, Any]            # the portfolio's choice: choice, reason, propose_s
    optuna: dict[str, Any]               # the Optuna trial this proposal is
    propose_seconds: float               # the proposer's time (monotonic)
    git_config_changed: list[str]        # git's configuration or hooks changed, put back
    duplicate_of: str                    # the attempt the duplicate gate found it repeats
    earlier_night: str                   # the earlier night whose attempt it repeats (engine/study.py)
    lookahead: dict[str, Any]            # prepared ahead: prepared, prepared_on, merged_onto
    rerun_of: int                        # the interrupted attempt this one runs again
    scouted: int                         # the scout attempt that promoted this full run
    scout_of: str                        # a scout run's kind at the full budget (candidate, fix)
    # the run (engine/attempt.py, execution/executors, engine/recovery.py)
    budget_s: float                      # what it trained for
    run_wrote: list[str]                 # files the run wrote in the repository, put back
    log_cut_bytes: int                   # bytes the capped log left out
    checks: dict[str, Any]               # --check: passed, seconds, wrote
    audit_bpb: float                     # the held-out figure (never decided on, never shown to a proposer)
    executor: str                        # executor slurm: executor, cluster, job_id (and its logs)
    cluster: str
    job_id: str
    job_name: str                        # autoloop-<tag>-<trial>.<attempt>
    node: str                            # where the job ran (Slurm's NodeList)
    nodes: list[dict[str, Any]]          # executor ray: every node of the trial (node, node_id, gpu_ids), first = node
    gpu_model: str                       # the GPU type Slurm bound (JOB_GRES gpu:<model>:N), where it names one
    tampered_before_run: list[str]       # protected inputs a proposer changed, restored
    tampered: list[str]                  # protected inputs changed by the run (core/keep.py, recovery)
    machine: dict[str, float | str]      # the machine probe's figures (execution/machine_speed.py)
    curve: list[list[float]]             # --prune: [elapsed training s, smoothed train loss] per progress line
    prune: dict[str, Any]                # --prune: a pruned run's at_s, budget_s, gap, band, reason
    # verification (verification/verify.py, verification/ladder.py)
    verify: dict[str, Any]               # variant, role, repeat, changes, scaled
    ladder: dict[str, Any]               # change, rung, side, multiplier, repeat, values
    # the decision (core/keep.py's Decision.extra)
    noise_samples: list[float]
    noise_method: str
    runs: list[float]                    # the runs a confirmation judged
    confirmation: dict[str, Any]         # a confirmation's count from power (core/power.ConfirmCount)
    scout_sample: bool
    scout: dict[str, Any]                # reference, margin, promoted
    invalid_metric: float
    guards: list[str]
    guard_breaches: list[dict[str, Any]]
    beat_start: str | None
    stale: bool
    adjusted: dict[str, Any]             # at the night's median machine speed: runs, best, noise, fit, raw


class Draft(BaseModel):
    """A record before its decision: what an attempt (or a skip) found. Built by
    engine/attempt.py, trial.record_skip, engine/recovery.py and engine/orphan.py; the
    arbiter adds the decision's fields (status, crash, reason, best, noise, confidence,
    next, worker, the decision's extra) and makes the :class:`LedgerRecord`. Its fields and
    defaults are the record's."""

    trial: int
    attempt: int = 1
    kind: AttemptKind = "candidate"
    started_at: float
    ended_at: float
    elapsed_s: float | None = None
    proposer: str
    parent: str | None = None
    commit: str | None = None
    description: str
    metric_name: str = "val_bpb"
    metric: float | None = None
    memory_gb: float = 0.0
    training_seconds: float | None = None
    total_seconds: float | None = None
    wall_seconds: float = 0.0
    exit_code: int | None = None
    signal: int | None = None
    diff_lines: int = 0
    seed: int | None = None
    fingerprint: str | None = None
    log_path: str | None = None
    outside_changes: list[str] = Field(default_factory=list)
    # Typed for the code that writes it, taken as it is (a proposer's facts may hold more keys).
    extra: Annotated[Extra, SkipValidation] = Field(default_factory=lambda: Extra())
    metrics: dict[str, float] = Field(default_factory=dict)
    world_size: int = 1
    tokens_per_s: float | None = None
    mfu_percent: float | None = None
    fidelity: Fidelity = "full"
    machine_speed: float | None = None

    def measured(self) -> dict[str, Any]:
        """Its fields but extra, as the record takes them."""
        return self.model_dump(exclude={"extra"})


# ---------------------------------------------------------------------------------------------
# results.tsv formatting: pure functions


# Everything str.splitlines() would break on, plus tab: none of it may reach a TSV field.
_BREAKS = re.compile(r"[\t\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def tsv_field(text: str) -> str:
    """One TSV-safe field: no tabs or line breaks, no double quotes, never empty."""
    text = _BREAKS.sub(" ", text).replace('"', "'").strip()
    return text or "-"


def trial_label(trial: int, attempt: int) -> str:
    """'7' for the first attempt of trial 7, '7.2', '7.3' for its later attempts."""
    return str(trial) if attempt <= 1 else f"{trial}.{attempt}"


def scout_description(record: LedgerRecord) -> str:
    """The TSV's description: a scout run's says so (and whether it was scouted out), so the
    table keeps autoresearch's columns and still tells the two rungs apart; a pruned run's
    says where it was stopped (its status column reads discard: autoresearch's three words)."""
    if record.status == "pruned":
        at = (record.extra.get("prune") or {}).get("at_s")
        return f"[pruned{f' at {at:.0f} s' if isinstance(at, (int, float)) else ''}] {record.description}"
    if record.fidelity != "scout":
        return record.description
    scout = record.extra.get("scout") or {}
    what = ("scouted out" if scout.get("promoted") is False else "scout, promoted" if scout.get("promoted")
            else "scout")
    return f"[{what}] {record.description}"


def tsv_row(record: LedgerRecord) -> list[str] | None:
    """The results.tsv fields of one record, or None for records the TSV leaves out: skips,
    ends by the cluster, and verification runs (the table is the night's search; report.md has
    the verdict)."""
    if record.status in ("skip", "ended") or record.kind == "verify":
        return None
    crashed = record.status == "crash"
    metric = 0.0 if crashed or record.metric is None else record.metric
    memory = 0.0 if crashed else record.memory_gb
    seconds = record.training_seconds if record.training_seconds is not None else record.wall_seconds
    if crashed:
        seconds = 0.0
    return [
        record.commit[:7] if record.commit else "-",
        f"{metric:.6f}",
        f"{memory:.1f}",
        "discard" if record.status == "pruned" else record.status,
        tsv_field(scout_description(record)),
        record.crash or "-",
        trial_label(record.trial, record.attempt),
        f"{seconds:.1f}",
        "-" if crashed or record.confidence is None else f"{record.confidence:.1f}",
        "-" if record.worker is None else str(record.worker),
        tsv_field(str(record.extra.get("hypothesis") or "")),
    ]


def format_tsv(records: Iterable[LedgerRecord]) -> str:
    """The whole results.tsv text: header, then one row per non-skip record in ledger order."""
    lines = ["\t".join(TSV_COLUMNS)]
    for record in records:
        row = tsv_row(record)
        if row is not None:
            lines.append("\t".join(row))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# ledger.jsonl parsing: pure function over the file's bytes


@dataclass
class _Parsed:
    """The outcome of reading ledger bytes: good records, and where a torn tail starts."""

    records: list[LedgerRecord]
    good_end: int              # byte offset just past the last good (or blank) line
    torn: bytes = b""          # the bytes of a torn tail, b"" when none
    torn_why: str = ""
    # The final line is a valid record that only lacks its newline (a hand edit).
    unterminated_record: bool = False
    lines: list[tuple[int, bytes]] = field(default_factory=list)   # each record's (line number, bytes)


def _parse(data: bytes, name: str) -> _Parsed:
    records: list[LedgerRecord] = []
    lines: list[tuple[int, bytes]] = []
    good_end = 0                                # just past the last good (or blank) line
    pending_bad: tuple[int, str] | None = None  # first non-JSON line after the last good one
    pos = 0
    lineno = 0
    while pos < len(data):
        lineno += 1
        nl = data.find(b"\n", pos)
        terminated = nl != -1
        end = nl + 1 if terminated else len(data)
        body = data[pos:end].rstrip(b"\r\n")
        pos = end

        if not terminated:
            # The final fragment. A complete record that only lacks its newline (a hand
            # edit) is kept; anything else is what a write cut short leaves: torn.
            try:
                record = LedgerRecord.model_validate_json(body)
            except ValueError:
                if pending_bad is None:
                    pending_bad = (lineno, "unterminated line")
                break
            if pending_bad is not None:
                _raise_middle(name, pending_bad)
            records.append(record)
            lines.append((lineno, body))
            return _Parsed(records, good_end, unterminated_record=True, lines=lines)

        if not body.strip():
            # Blank lines carry no data; skip them rather than call the file corrupt.
            if pending_bad is None:
                good_end = end
            continue
        try:
            record = LedgerRecord.model_validate_json(body)
        except ValidationError as e:
            if any(err["type"] == "json_invalid" for err in e.errors()):
                # Not JSON: part of a torn tail if nothing good follows, corruption otherwise.
                if pending_bad is None:
                    pending_bad = (lineno, f"not valid JSON ({_first_error(e)})")
                continue
            # Valid JSON that is not a record is never a power-loss artefact: the user must look.
            raise LedgerError(f"{name} line {lineno}: not a valid ledger record ({_first_error(e)}); "
                              "fix or remove the line by hand") from None
        if pending_bad is not None:
            _raise_middle(name, pending_bad)
        records.append(record)
        lines.append((lineno, body))
        good_end = end

    torn = data[good_end:]
    why = pending_bad[1] if torn and pending_bad else ""
    return _Parsed(records, good_end, torn, why, lines=lines)


def _raise_middle(name: str, bad: tuple[int, str]) -> NoReturn:
    lineno, why = bad
    raise LedgerError(f"{name} line {lineno}: {why}, with good records after it, so not a torn "
                      "write; fix or remove the line by hand")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    if err["type"] == "json_invalid":
        return _one_line(err.get("msg", "")).removeprefix("Invalid JSON: ")
    where = ".".join(str(p) for p in err.get("loc", ())) or "record"
    return f"{where}: {_one_line(err.get('msg', 'invalid'))}"


# ---------------------------------------------------------------------------------------------
# the Ledger


class Ledger:
    """results/ledger.jsonl + results/results.tsv under one file lock."""

    def __init__(self, results_dir: Path, *, fsync: bool = True, lock_timeout: float = 60.0):
        """``fsync=False`` skips the per-append fsync (tests and benchmarks only: a power
        loss may then lose recent records). ``lock_timeout``: seconds to wait for another
        writer before raising LedgerError; flock is released when its holder dies, so a
        wait this long means a live process is stuck holding it."""
        self.layout = Layout(Path(results_dir)).ensure()
        self.results_dir = self.layout.root
        self.path = self.layout.ledger
        self.tsv_path = self.layout.tsv
        self.lock_path = self.layout.ledger_lock
        self.fsync = fsync
        self.lock_timeout = lock_timeout
        self._lock = FileLock(str(self.lock_path), timeout=lock_timeout)
        # Reports of repairs that append() had to do by itself (the caller may log them).
        self.repairs: list[str] = []
        # Where append() says what it found that autoloop did not write (the night's console).
        self.notice: Callable[[str], None] | None = None
        self._told: set[int] = set()   # line numbers already reported
        # The orchestrator's ledger: nothing else appends (the workspace lock), so a line after
        # the last one this process wrote is not autoloop's (_chained).
        self.sole_writer = False
        self._ours: str | None = None
        self._walked: tuple[int, int, chain.Chain] = (0, 0, chain.Chain())
        self.last_breaks: list[chain.Break] = []

    # -- locking ------------------------------------------------------------------------------

    def _acquire(self) -> None:
        try:
            # filelock polls a non-blocking flock; its 50 ms default interval would make
            # contended appends crawl, so poll often (appends hold the lock ~1 ms).
            self._lock.acquire(poll_interval=0.002)
        except Timeout:
            raise LedgerError(f"{self.lock_path}: another process has held the ledger lock for "
                              f"{self.lock_timeout:.0f}s; is it stuck?") from None

    # -- reading ------------------------------------------------------------------------------

    def _read_bytes(self) -> bytes:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return b""

    def _parse(self) -> _Parsed:
        return _parse(self._read_bytes(), str(self.path))

    def records(self) -> list[LedgerRecord]:
        """Every valid record autoloop wrote, in file order. A torn tail is ignored (repair()
        moves it away); corruption with good records after it raises LedgerError. Lines the
        hash chain rejects (chain.py) are left out, and named by :meth:`breaks`."""
        return self._trusted(self._parse())[0]

    def _trusted(self, parsed: _Parsed) -> tuple[list[LedgerRecord], chain.Walk]:
        walk = chain.verify(parsed.lines)
        self.last_breaks = walk.breaks
        bad = {b.lineno for b in walk.breaks}
        return [r for r, (n, _) in zip(parsed.records, parsed.lines, strict=True) if n not in bad], walk

    def breaks(self) -> list[chain.Break]:
        """The lines autoloop did not write as they are (edited, appended, copied): chain.py."""
        return chain.verify(self._parse().lines).breaks

    def tsv_differences(self) -> list[int]:
        """Line numbers where results.tsv is not what the ledger regenerates (a row forged,
        edited or removed); [] when it matches or does not exist."""
        try:
            have = self.tsv_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return []
        want = format_tsv(self.records()).splitlines()
        return [i + 1 for i in range(max(len(have), len(want)))
                if i >= len(have) or i >= len(want) or have[i] != want[i]]

    def integrity_lines(self) -> list[str]:
        """One line per record autoloop did not write as it is, and for a results.tsv that
        differs from the ledger: what `status`, `report` and `--resume` print."""
        breaks = self.breaks()
        self._told.update(b.lineno for b in breaks)   # append() does not say them again
        out = [b.describe(self.path.name) + " (not counted)" for b in breaks]
        rows = self.tsv_differences()
        if rows:
            shown = ", ".join(map(str, rows[:5])) + (f" and {len(rows) - 5} more" if len(rows) > 5 else "")
            out.append(f"{self.tsv_path.name} line{'s' if len(rows) > 1 else ''} {shown}: not what the ledger "
                       f"gives (edited by hand or by an agent); the ledger is the truth, the file is rewritten "
                       f"from it at the next record")
        return out

    def __len__(self) -> int:
        return len(self.records())

    def last(self, n: int) -> list[dict[str, Any]]:
        """The last n records as plain dicts (JSON-ready), oldest first."""
        if n <= 0:
            return []
        return [r.model_dump(mode="json") for r in self.records()[-n:]]

    # -- repair -------------------------------------------------------------------------------

    def repair(self) -> str | None:
        """Repair a torn last line; return a one-line report of what was done, or None."""
        self._acquire()
        try:
            return self._repair_locked()
        finally:
            self._lock.release()

    def _repair_locked(self) -> str | None:
        data = self._read_bytes()
        parsed = _parse(data, str(self.path))
        if parsed.unterminated_record:
            # A hand edit that dropped the final newline: the record is good, finish its line.
            self._write_all(b"\n")
            return f"{self.path.name}: the last record lacked its newline; added it (record kept)"
        if not parsed.torn:
            return None
        stamp = time.strftime("%Y%m%dT%H%M%S")
        torn_path = self.layout.torn(stamp)
        n = 1
        while torn_path.exists():
            n += 1
            torn_path = self.layout.torn(f"{stamp}-{n}")
        # Save the fragment durably BEFORE truncating: a crash in between leaves it in
        # both places, never in neither.
        with open(torn_path, "xb") as f:
            f.write(parsed.torn)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(self.results_dir)
        with open(self.path, "r+b") as f:
            f.truncate(parsed.good_end)
            f.flush()
            os.fsync(f.fileno())
        return (f"{self.path.name}: moved a torn tail ({len(parsed.torn)} bytes, {parsed.torn_why}) "
                f"to {torn_path.name}; {len(parsed.records)} good records kept")

    # -- writing ------------------------------------------------------------------------------

    def append(self, record: LedgerRecord | dict[str, Any], write_tsv: bool = True) -> None:
        """Append (flush + fsync under the lock), then rewrite results.tsv atomically.

        ``write_tsv=False`` skips the rewrite (bulk writers); call write_tsv() after.
        """
        if isinstance(record, dict):
            record = LedgerRecord.model_validate(record)
        try:
            line = record.model_dump_json(exclude={"chain"})
        except Exception as e:  # e.g. something unserialisable in `extra`
            raise LedgerError(f"ledger record of trial {record.trial} cannot be written as JSON: "
                              f"{_one_line(str(e))}") from None
        # Round-trip now so a line that could not be read back is never written.
        LedgerRecord.model_validate_json(line)

        self._acquire()
        try:
            if not self._tail_is_clean():
                report = self._repair_locked()
                if report:
                    self.repairs.append(report)
                    self._tell(f"ledger: {report}")
                self._walked = (0, 0, chain.Chain())
            ours = self._ours
            try:
                self._write_all(self._chained(line))
            except BaseException:   # not written (a full disk): the chain goes on from the file
                self._ours, self._walked = ours, (0, 0, chain.Chain())
                raise
            if write_tsv:
                self._write_tsv_locked()
        finally:
            self._lock.release()

    def _walk_new(self) -> chain.Chain:
        """The chain walked up to the file's end, reading only the lines added since the last
        walk (the file is append-only; a repair, or a file that shrank, starts it over)."""
        offset, lineno, walk = self._walked
        try:
            with open(self.path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                if size < offset:
                    offset, lineno, walk = 0, 0, chain.Chain()
                f.seek(offset)
                data = f.read(size - offset)
        except FileNotFoundError:
            offset, lineno, walk, data = 0, 0, chain.Chain(), b""
        end = data.rfind(b"\n") + 1
        for raw in data[:end].split(b"\n")[:-1]:
            lineno += 1
            if raw.strip():
                walk.feed(lineno, raw)
        self._walked = (offset + end, lineno, walk)
        return walk

    def _chained(self, line: str) -> bytes:
        """The line to append, chained (chain.py) to the file's last record; for the night's
        own ledger (``sole_writer``), to the last record this process wrote when something
        else appended after it (a well-forged line is so left out of the chain). Reports
        the lines the chain rejects, once each."""
        walk = self._walk_new()
        prev = walk.head
        if self.sole_writer and self._ours is not None and self._ours != prev:
            prev = self._ours
        sealed = chain.seal(prev, line)
        self._ours = chain.split(sealed.encode("utf-8"))[1]
        walk.feed(self._walked[1] + 1, sealed.encode("utf-8"))
        self._walked = (self._walked[0] + len(sealed.encode("utf-8")) + 1, self._walked[1] + 1, walk)
        for lineno, why in sorted(walk.breaks.items()):
            if lineno not in self._told:
                self._told.add(lineno)
                self._tell(f"ledger: {chain.Break(lineno, why).describe(self.path.name)} (not counted)")
        return (sealed + "\n").encode("utf-8")

    def _tell(self, line: str) -> None:
        if self.notice is not None:
            self.notice(line)

    def _tail_is_clean(self) -> bool:
        """Cheap check that the file ends with a complete JSON line (or is empty)."""
        try:
            with open(self.path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                if size == 0:
                    return True
                window = 1 << 16
                while True:
                    start = max(0, size - window)
                    f.seek(start)
                    chunk = f.read(size - start)
                    if not chunk.endswith(b"\n"):
                        return False
                    prev_nl = chunk.rfind(b"\n", 0, len(chunk) - 1)
                    if prev_nl != -1 or start == 0:
                        last = chunk[prev_nl + 1:]
                        break
                    window *= 4   # a very long last line: widen the window
        except FileNotFoundError:
            return True
        if not last.strip():
            return True
        try:
            json.loads(last)
        except ValueError:
            return False
        return True

    def _write_all(self, data: bytes) -> None:
        fault_write(self.path)   # off unless AUTOLOOP_FAULT_WRITE names this file (benchmarks/chaos.py)
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            # One write call for the whole line; the loop only matters if the kernel
            # writes short (it does not for regular files in practice). The lock keeps
            # other writers out either way.
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if created and self.fsync:
            fsync_dir(self.results_dir)   # make the new directory entry itself durable

    def write_tsv(self) -> None:
        """Rewrite results.tsv from the ledger: temp file in results/, fsync, os.replace."""
        self._acquire()
        try:
            self._write_tsv_locked()
        finally:
            self._lock.release()

    def _write_tsv_locked(self) -> None:
        atomic_write(self.tsv_path, format_tsv(self.records()), fsync=self.fsync)

