"""The night as part of a study: its facts written, the earlier nights read once at its start.

``open_study`` runs as a night opens (``run`` only): it writes ``night.json`` (the budget,
data fingerprint, metric and machine it runs under, store/study.py), reads every earlier
night of the workspace and keeps those whose numbers can be compared with this one. What
they give the night, held in :class:`Memory`:

* the digest's section of earlier nights (what was kept, what failed and in which ranges,
  crashes that recur), built once: their ledgers do not change;
* the duplicate gate across nights (:meth:`Memory.twin`): a change identical to one an
  earlier comparable night measured on the same parent *code* (by its normalised text, not
  its commit: each night has its own branch) is not trained again, its earlier result is
  shown to the proposer instead;
* the search's warm start (:meth:`Memory.points`): the earlier measured points, read from
  git once, for the mutator and Optuna (``--no-warm-start``: none).

Each of these is said in one line at the start.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from git import BadName, BadObject

from autoloop.config.settings import Settings
from autoloop.core import duplicate_gate
from autoloop.core.duplicate_gate import code_key
from autoloop.proposers.warm_start import EarlierPoint
from autoloop.repo.workspace import Workspace, WorkspaceError
from autoloop.store import queries
from autoloop.store.digest import EarlierNight
from autoloop.store.held_up import held_up
from autoloop.store.ledger import LedgerRecord
from autoloop.store.study import NightInfo, StudyNight, comparable_earlier, differences, read_study, write_info

# Earlier measured points handed to the search, the newest first: enough for a sampler to
# model from (Optuna's TPE uses the best tenth of them), bounded so that reading them from
# git at the start stays a matter of seconds even after many long nights.
WARM_POINTS = 400


@dataclass
class Twin:
    """An earlier night's attempt that made the same change on the same code."""

    label: str            # its night's tag and its trial, as the proposer is shown them
    record: LedgerRecord


@dataclass
class Memory:
    """What the earlier comparable nights give this one (see the module docstring)."""

    nights: list[StudyNight] = field(default_factory=list)          # comparable, oldest first
    others: list[tuple[StudyNight, list[str]]] = field(default_factory=list)   # not comparable, and why
    start_code: str | None = None       # code_key of the target this night started from
    warm: bool = True
    _points: list[EarlierPoint] | None = None
    _codes: dict[str, str | None] = field(default_factory=dict)      # commit -> code_key of its target
    _texts: dict[str, tuple[str, ...] | None] = field(default_factory=dict)   # commit -> normalised target

    def warm_line(self, proposer: str) -> str | None:
        """Whether the search starts warm, said at the start for the proposers it seeds."""
        if not self.nights or proposer not in ("mutate", "optuna", "portfolio"):
            return None
        tags = ", ".join(n.tag for n in self.nights)
        return (f"study: the search is warm-started from {tags} (--no-warm-start to start cold)" if self.warm
                else "study: the search starts cold (--no-warm-start)")

    def digest_nights(self) -> list[EarlierNight]:
        return [EarlierNight(n.tag, n.night_records, n.info.direction or "min",
                             held_up(n.night_records, n.folder, n.tag, n.info.direction or "min"))
                for n in self.nights]

    def points(self, ws: Workspace) -> list[EarlierPoint]:
        """The search's warm start: measured trials of the earlier nights, read once."""
        if not self.warm or not self.nights:
            return []
        if self._points is None:
            self._points = self._read_points(ws)
        return self._points

    def twin(self, ws: Workspace, edit: str, parent: str | None) -> Twin | None:
        """An earlier night's attempt of the same change (normalised) on the same parent code."""
        if parent is None or not self.nights:
            return None
        here = self._code(ws, parent)
        if here is None:
            return None
        mine = duplicate_gate.normalise(edit)
        for night in reversed(self.nights):
            for r in reversed(night.night_records):
                if (r.parent and r.commit and r.kind not in ("baseline", "verify") and r.status != "skip"
                        and not queries.was_interrupted(r) and self._code(ws, r.parent) == here
                        and self._normalised(ws, r.commit) == mine):
                    return Twin(f"{night.tag} #{r.trial}", r)
        return None

    # -- reading git, once per commit -------------------------------------------------------

    def _text(self, ws: Workspace, commit: str) -> str | None:
        try:
            return ws.file_at(commit, ws.target)
        except (ValueError, BadName, BadObject, WorkspaceError):   # a commit git no longer has
            return None

    def _code(self, ws: Workspace, commit: str) -> str | None:
        if commit not in self._codes:
            text = self._text(ws, commit)
            self._codes[commit] = None if text is None else code_key(text)
        return self._codes[commit]

    def _normalised(self, ws: Workspace, commit: str) -> tuple[str, ...] | None:
        if commit not in self._texts:
            text = self._text(ws, commit)
            self._texts[commit] = None if text is None else duplicate_gate.normalise(text)
        return self._texts[commit]

    def _read_points(self, ws: Workspace) -> list[EarlierPoint]:
        points: list[EarlierPoint] = []
        for night in reversed(self.nights):
            anchor = self._anchor(ws, night)
            for r in reversed(night.night_records):
                if len(points) >= WARM_POINTS:
                    break
                if (r.kind not in ("candidate", "fix") or r.status not in ("keep", "discard", "crash")
                        or not r.commit or not r.parent or r.fidelity != "full"):
                    continue
                parent_code = self._code(ws, r.parent)
                if parent_code is None:
                    continue
                value = r.metric if r.status != "crash" else None
                points.append(EarlierPoint(night.tag, r.trial, r.description, r.status, value, anchor,
                                           self._text(ws, r.commit), parent_code))
        return list(reversed(points))

    def _anchor(self, ws: Workspace, night: StudyNight) -> float | None:
        """That night's value of the code this night starts from (warm_start.py): the mean of
        its runs of that code, else its baseline."""
        values = [r.metric for r in night.night_records
                  if r.metric is not None and r.status in ("keep", "discard") and r.commit
                  and self.start_code is not None and self._code(ws, r.commit) == self.start_code]
        return sum(values) / len(values) if values else night.baseline


def open_study(settings: Settings, ws: Workspace, results_dir: Path, tag: str, fingerprint: str | None,
               say: Callable[[str], None]) -> Memory:
    """night.json written, the earlier nights read, what they give this night said in lines."""
    s = settings
    info = NightInfo(tag=tag, started_at=time.time(), budget_s=float(s.budget), metric=s.metric,
                     direction=s.direction, fingerprint=fingerprint, gpu=machine_gpu(s.device),
                     world_size=s.gpus_per_trial, from_tag=s.from_tag, start_commit=ws.head())
    write_info(results_dir, info)
    unreadable: list[str] = []
    nights = read_study(results_dir, tag, unreadable)
    for line in unreadable:
        say(f"study: an archived night left out, its ledger unreadable ({line})")
    current = next((n for n in nights if n.live and n.tag == tag), None)
    if current is None:
        current = StudyNight(tag, results_dir, True, info)
    memory = Memory(warm=s.warm_start)
    memory.nights = comparable_earlier(nights, current)
    memory.others = [(n, differences(n, current)) for n in nights
                     if n is not current and n.tag != tag and n not in memory.nights]
    start = ws.file_at(ws.head(), ws.target)
    memory.start_code = code_key(start) if start is not None else None
    _say(say, memory)
    return memory


def machine_gpu(device: str | None) -> str:
    """The GPU model trials run on (nvidia-smi's first name), "cpu" without one."""
    if device == "cpu" or shutil.which("nvidia-smi") is None:
        return "cpu"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return names[0] if names else "unknown"


def _say(say: Callable[[str], None], memory: Memory) -> None:
    if not memory.nights and not memory.others:
        return
    tags = ", ".join(n.tag for n in memory.nights) or "none"
    say(f"study: {len(memory.nights)} earlier comparable night(s) ({tags}): their results are in the prompt's "
        "digest and the duplicate gate")
    for other, why in memory.others:
        say(f"study: night {other.tag} not comparable ({'; '.join(why)}): its numbers are kept apart")
