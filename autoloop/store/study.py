"""The study: every night of a workspace read as one, and which of them can be compared.

A researcher runs many nights on one problem; each new ``--tag`` moves the last night's
results to ``results/archive/<tag>-<stamp>/`` (opening.py). The study is those archived
nights and the live one, oldest first, each with its facts: tag, dates, baseline, best,
budget, data fingerprint, metric, machine (GPU model, world size) and the commit of
train.py at its start (its baseline's). The facts a night was run under are written once
at its start to ``night.json`` (:func:`write_info`), archived with its ledger; a night from
before that file existed has its facts read from its records, the budget left unknown.

Two nights are *comparable* when their budget, corpus fingerprint, metric (name and
direction) and machine (GPU model and world size) agree: only then is one's number a
measurement of the same thing as the other's. :func:`differences` says what differs; a
fact unknown on either side is not counted as a difference (an old night without
``night.json`` is compared on what its records say), and the reasons are shown so a
person can judge. Pure reading: nothing here writes except :func:`write_info`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoloop.core.layout import Layout
from autoloop.store import queries
from autoloop.store.atomic import atomic_write
from autoloop.store.ledger import Ledger, LedgerError, LedgerRecord
from autoloop.store.state import load_state

_ARCHIVE = re.compile(r"^(?P<tag>.+)-(?P<stamp>\d{8}-\d{6})$")


@dataclass(frozen=True)
class NightInfo:
    """What a night was run under, written at its start (``night.json``)."""

    tag: str
    started_at: float
    budget_s: float | None = None
    metric: str | None = None
    direction: str | None = None
    fingerprint: str | None = None
    gpu: str | None = None           # the GPU model ("NVIDIA H100 80GB HBM3"), "cpu" without one
    world_size: int | None = None    # ranks per trial
    from_tag: str | None = None      # `run --from TAG`: the night whose final branch it started on
    start_commit: str | None = None  # HEAD when it started: train.py at its start

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class StudyNight:
    """One night of the study: its facts, its records, and where they are."""

    tag: str
    folder: Path                     # results/ (the live night) or its archive folder
    live: bool
    info: NightInfo
    records: list[LedgerRecord] = field(default_factory=list)

    @property
    def night_records(self) -> list[LedgerRecord]:
        """The search's records (autoloop verify's runs left out)."""
        return queries.of_night(self.records)

    @property
    def started_at(self) -> float | None:
        return self.records[0].started_at if self.records else self.info.started_at

    @property
    def ended_at(self) -> float | None:
        return max(r.ended_at for r in self.records) if self.records else None

    @property
    def baseline(self) -> float | None:
        base = queries.baseline_estimate(self.records)
        return None if base is None else base.metric

    @property
    def baseline_commit(self) -> str | None:
        base = queries.baseline(self.records)
        return base.commit if base is not None else self.info.start_commit

    @property
    def best(self) -> tuple[str | None, float | None]:
        return queries.best(self.records)

    @property
    def gain(self) -> float | None:
        """The best's improvement over the baseline, positive when better (either direction)."""
        base, (_, best) = self.baseline, self.best
        if base is None or best is None:
            return None
        return (base - best) if (self.info.direction or "min") == "min" else (best - base)

    @property
    def kept(self) -> list[LedgerRecord]:
        return [r for r in self.night_records if r.status == "keep" and r.kind != "baseline"
                and not queries.is_noise_sample(r)]

    @property
    def verify_runs(self) -> int:
        """Runs of ``autoloop verify`` on this night's kept changes (0: never verified)."""
        return sum(1 for r in self.records if r.kind == "verify")

    @property
    def device_hours(self) -> float:
        """Wall hours of the trials, times the devices each used."""
        return sum(r.wall_seconds * max(r.world_size, 1) for r in self.records) / 3600.0


def write_info(results_dir: Path, info: NightInfo) -> None:
    """The night's facts, written once at its start (a resume keeps the first)."""
    path = Layout(results_dir).night_info
    if not path.exists():
        atomic_write(path, json.dumps(info.to_json(), indent=1) + "\n")


def read_study(results_dir: Path, current_tag: str | None = None,
               unreadable: list[str] | None = None) -> list[StudyNight]:
    """Every night under ``results_dir``, archived ones and the live one, oldest first.
    ``current_tag``: the night being run now, whose ledger may not exist yet. An archived
    ledger that cannot be read is left out (its one-line reason appended to ``unreadable``):
    a damaged old night must not stop a new one."""
    layout = Layout(results_dir)
    nights: list[StudyNight] = []
    if layout.archive.is_dir():
        for folder in sorted(layout.archive.iterdir(), key=lambda p: _stamp(p.name)):
            match = _ARCHIVE.match(folder.name)
            if match and (folder / "ledger.jsonl").exists():
                try:
                    nights.append(_night(folder, match["tag"], live=False))
                except (LedgerError, OSError) as e:
                    if unreadable is not None:
                        unreadable.append(f"{folder.name}: {e}")
    if layout.ledger.exists():
        tag = load_state(layout.root).tag or current_tag
        if tag is not None:
            nights.append(_night(layout.root, tag, live=True))
    nights.sort(key=lambda n: n.started_at or 0.0)
    return nights


def differences(night: StudyNight, reference: StudyNight) -> list[str]:
    """Why ``night``'s numbers cannot be compared with ``reference``'s ([] when they can)."""
    a, b = night.info, reference.info
    out = []
    if a.budget_s is not None and b.budget_s is not None and abs(a.budget_s - b.budget_s) > 1e-6:
        out.append(f"budget {a.budget_s:g}s, not {b.budget_s:g}s")
    if a.fingerprint and b.fingerprint and a.fingerprint != b.fingerprint:
        out.append(f"corpus {a.fingerprint[:12]}, not {b.fingerprint[:12]}")
    if (a.metric and b.metric and a.metric != b.metric) or (a.direction and b.direction and a.direction != b.direction):
        out.append(f"metric {a.metric} ({a.direction}), not {b.metric} ({b.direction})")
    if a.gpu and b.gpu and a.gpu != b.gpu:
        out.append(f"machine {a.gpu}, not {b.gpu}")
    if a.world_size and b.world_size and a.world_size != b.world_size:
        out.append(f"world size {a.world_size}, not {b.world_size}")
    return out


def comparable_earlier(nights: Sequence[StudyNight], current: StudyNight) -> list[StudyNight]:
    """The nights before ``current`` whose numbers can be compared with it, oldest first."""
    return [n for n in nights if n is not current and n.tag != current.tag and not differences(n, current)]


# ------------------------------------------------------------------------------ reading


def _night(folder: Path, tag: str, live: bool) -> StudyNight:
    records = Ledger(folder).records()
    return StudyNight(tag, folder, live, _info(folder, tag, records), records)


def _info(folder: Path, tag: str, records: list[LedgerRecord]) -> NightInfo:
    """night.json when there is one; else what the records say (an older night)."""
    try:
        data = json.loads((folder / Layout(folder).night_info.name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if isinstance(data, dict):
        known: dict[str, Any] = {k: data.get(k) for k in NightInfo.__dataclass_fields__ if k in data}
        known["tag"] = tag
        if isinstance(known.get("started_at"), (int, float)):
            try:
                return NightInfo(**known)
            except TypeError:
                pass
    base = queries.baseline(records)
    return NightInfo(tag=tag, started_at=records[0].started_at if records else 0.0,
                     budget_s=queries.night_budget(records), direction=queries.infer_direction(records),
                     metric=records[0].metric_name if records else None,
                     fingerprint=base.fingerprint if base is not None else None,
                     world_size=base.world_size if base is not None else None,
                     start_commit=base.commit if base is not None else None)


def _stamp(name: str) -> str:
    match = _ARCHIVE.match(name)
    return match["stamp"] if match else name
