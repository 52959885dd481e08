"""What the dashboard's JSON endpoints return: read-only views of one workspace.

Everything comes from ``results/`` (the ledger, the state files, the run logs) and from git
for the commits the ledger names; nothing is written, no lock is taken, so it is safe while
a loop runs. Paths come from the ledger and the state file only, never from a request, and
each is confined to ``results/`` (:func:`confined`): a hand-edited ledger naming
``../../etc/passwd`` as a log, or a log that is a symlink out of the folder, is refused.

The text in these views (descriptions, reasons, logs, diffs) is untrusted: agents wrote it.
It goes out as JSON strings, and the page only ever sets it as ``textContent``.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from autoloop.core.layout import Layout
from autoloop.observe.console import parse_progress
from autoloop.repo.gitview import branch_names, record_diff
from autoloop.review.history import history_payload
from autoloop.review.machine_speed import machine_data
from autoloop.review.status import status_data
from autoloop.store.ledger import Ledger, LedgerRecord, trial_label
from autoloop.store.queries import best_before, infer_direction, is_noise_sample, running_best
from autoloop.store.state import load_state, worker_state_name
from autoloop.store.tradeoffs import front_data

LOG_TAIL_BYTES = 64 * 1024
LOG_TAIL_LINES = 200


class NotFound(Exception):
    """No such attempt; the message is one line."""


def confined(results_dir: Path, relative: str | None) -> Path | None:
    """``results_dir / relative`` when it stays inside ``results_dir`` once every symlink is
    resolved; None otherwise (absolute, ``..``, a link out, or nothing given)."""
    if not relative or "\0" in relative:
        return None
    base = Path(results_dir).resolve()
    try:
        path = (base / relative).resolve()
    except (OSError, RuntimeError):   # a symlink loop
        return None
    return path if path.is_relative_to(base) and path != base else None


def log_tail(results_dir: Path, relative: str | None, limit: int = LOG_TAIL_BYTES,
             lines: int = LOG_TAIL_LINES) -> dict[str, Any]:
    """The end of a run log: ``{"text", "truncated", "size"}``, or ``{"error"}``."""
    path = confined(results_dir, relative)
    if path is None:
        return {"error": f"refused: {relative!r} is not a file inside results/" if relative else "no log"}
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - limit)
            f.seek(start)
            data = f.read(limit)
    except FileNotFoundError:
        return {"error": "no log (yet)"}
    except OSError as e:
        return {"error": f"cannot read the log: {e.strerror or e}"}
    text = data.decode("utf-8", errors="replace")
    if start:
        text = text.split("\n", 1)[-1]   # the first line is cut: drop it
    kept = text.splitlines()
    truncated = bool(start) or len(kept) > lines
    return {"text": "\n".join(kept[-lines:]), "truncated": truncated, "size": size}


class WorkspaceViews:
    """The views of one experiment repository (its root, with ``results/`` inside)."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.layout = Layout.of(self.root)
        self.results = self.layout.root
        self._cache_key: tuple[int, int, int] | None = None
        self._cache: list[LedgerRecord] = []
        self._lock = threading.Lock()

    def records(self) -> list[LedgerRecord]:
        """The ledger's records, re-read only when the file changed (polling is cheap)."""
        path = self.layout.ledger
        try:
            st = path.stat()
        except FileNotFoundError:
            return []
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            if key != self._cache_key:
                self._cache = Ledger(self.results).records()
                self._cache_key = key
            return self._cache

    # -- endpoints ----------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        data = status_data(self.results)
        records = self.records()
        data["direction"] = infer_direction(records)
        data["records"] = len(records)
        data["front"] = front_data(records, data["direction"])   # the trade-offs panel (store/tradeoffs.py)
        data.pop("last", None)   # the table has every row
        return data

    def history(self) -> dict[str, Any]:
        """The study across nights (history.py): the page asks again only when the ledger grew."""
        return history_payload(self.results, branch_names(self.root))

    def attempts(self, start: int = 0) -> dict[str, Any]:
        """Rows from ledger index ``start`` on. ``first`` identifies the ledger: when it changes
        (a new tag archived the old one) the page starts over."""
        records = self.records()
        before = best_before(records)
        start = max(0, min(start, len(records)))
        shown = running_best(records)   # the chart's running-best line: noise samples do not step it
        adjusted = _adjusted(records)
        rows = [{**_row(i, r, before[i], adjusted), "running_best": shown[i]} for i, r in enumerate(records)
                if i >= start]
        first = f"{records[0].trial}.{records[0].attempt}@{records[0].started_at}" if records else None
        return {"total": len(records), "start": start, "first": first, "rows": rows}

    def attempt(self, trial: int, attempt: int) -> dict[str, Any]:
        """One attempt in full: its texts, its diff against its parent (git), its log's tail."""
        records = self.records()
        before = best_before(records)
        found = next(((i, r) for i, r in enumerate(records) if r.trial == trial and r.attempt == attempt), None)
        if found is None:
            raise NotFound(f"no attempt {trial}.{attempt} in the ledger")
        i, r = found
        row = _row(i, r, before[i], _adjusted(records))
        diff = record_diff(self.root, r)
        row.update(
            diff=diff, diff_error=None if diff is not None else "no diff: the commit is not in this repository",
            log=log_tail(self.results, r.log_path), outside_changes=r.outside_changes,
            git_events=[str(e) for e in r.extra.get("git_events", [])],
            tampered=[str(p) for p in r.extra.get("tampered", [])],
            exit_code=r.exit_code, signal=r.signal, diff_lines=r.diff_lines, seed=r.seed,
            parent=r.parent, best=r.best, log_path=r.log_path,
        )
        return row

    def live(self) -> dict[str, Any]:
        """The attempts in flight (the single loop's, or each worker's) with their live logs."""
        state = load_state(self.results)
        states = [("", state)]
        if state.workers:
            states += [(f"w{k}", load_state(self.results, worker_state_name(k))) for k in range(state.workers)]
        out = []
        for worker, st in states:
            if not st.in_flight or st.trial is None:
                continue
            rel = self.layout.log_rel(st.trial, st.attempt or 1)
            out.append({"worker": worker or None, "label": trial_label(st.trial, st.attempt or 1),
                        "trial": st.trial, "attempt": st.attempt or 1, "kind": st.kind, "phase": st.phase,
                        "description": st.description, "proposer": st.proposer, "progress": st.progress,
                        "attempt_started_at": st.attempt_started_at, "phase_started_at": st.phase_started_at,
                        "log": log_tail(self.results, rel, lines=80) if st.phase in ("running", "judging") else None,
                        **{k: v for k, v in parse_progress(st.progress).items() if k in ("percent", "loss")}})
        # The next trial's proposal, made while the one above trains, and the candidates
        # prepared that wait for their turn: what the device does next.
        for k, path in self.layout.ahead_states():
            st = load_state(self.results, path.name)
            if st.in_flight and st.trial is not None:
                out.append({"worker": None if k is None else f"w{k}", "label": trial_label(st.trial, st.attempt or 1),
                            "trial": st.trial, "attempt": st.attempt or 1, "kind": "look-ahead", "phase": st.phase,
                            "description": st.description, "proposer": st.proposer, "progress": None,
                            "attempt_started_at": st.attempt_started_at, "phase_started_at": st.phase_started_at,
                            "log": None, "lookahead": True})
        prepared = sorted(int(p.stem) for p in self.layout.prepared_dir.glob("*.json") if p.stem.isdigit())
        return {"now": time.time(), "attempts": out, "prepared": prepared}


def _adjusted(records: list[LedgerRecord]) -> dict[str, float]:
    """Each probed run's metric at the night's median machine speed, by label (review/machine_speed.py)."""
    found: dict[str, float] = (machine_data(records) or {}).get("adjusted", {})
    return found


def _row(index: int, r: LedgerRecord, reference: float | None,
         adjusted: dict[str, float] | None = None) -> dict[str, Any]:
    delta = None
    if r.metric is not None and reference is not None and r.kind != "baseline":
        delta = r.metric - reference
    seconds = r.training_seconds if r.training_seconds is not None else r.wall_seconds
    hypothesis = r.extra.get("hypothesis")
    return {
        "index": index, "label": trial_label(r.trial, r.attempt), "trial": r.trial, "attempt": r.attempt,
        "kind": r.kind, "status": r.status, "crash": r.crash, "metric": r.metric,
        "metric_name": r.metric_name, "delta": delta, "best_metric": r.best_metric,
        "confidence": r.confidence, "noise": r.noise, "description": r.description,
        "hypothesis": hypothesis if isinstance(hypothesis, str) else None, "reason": r.reason,
        "commit": r.commit, "proposer": r.proposer, "worker": r.worker, "seconds": seconds,
        "started_at": r.started_at, "ended_at": r.ended_at, "noise_sample": is_noise_sample(r),
        "memory_gb": r.memory_gb, "fidelity": r.fidelity, "machine_speed": r.machine_speed,
        "adjusted_metric": (adjusted or {}).get(trial_label(r.trial, r.attempt)),
    }
