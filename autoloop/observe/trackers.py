"""`--track wandb|mlflow`: every attempt as a run in the experiment tracker people already use.

One run per judged attempt (keep, discard, crash; skipped proposals ran nothing), grouped by
the night: the W&B group / the MLflow experiment ``autoloop/<tag>``. Each run carries

* config / params: the target's module-level UPPER_CASE constants at the attempt's commit,
  and the attempt's identity (trial, attempt, kind, proposer, commit, parent, seed, worker,
  budget, description);
* metrics: the metric (``val_bpb``), training seconds, wall seconds, memory, the best after
  the decision, confidence and noise where known, and the training loss per step as
  train.py printed it in its log;
* status and crash class (W&B summary, MLflow tags; a crashed attempt's run is failed);
* the diff of the attempt against its parent, from git, as an artifact (``diff.patch``).

Where the runs go: W&B's own settings (``WANDB_PROJECT``, default ``autoloop``;
``WANDB_MODE=offline`` keeps them on disk under ``results/wandb/`` for ``wandb sync``
later); MLflow's ``MLFLOW_TRACKING_URI``, by default a SQLite store in
``results/mlflow/`` with the artifacts beside it (never the repository's work tree, which
the loop keeps clean).

A tracker never stops or slows the loop: attempts are handed to one background thread,
and any failure there is one warning line. Which attempts reached a tracker is kept in
``results/trackers/<name>.done``; at the next start the ones that did not (a kill, a
tracker that was down, ``--track`` added mid-night) are logged then.
"""

from __future__ import annotations

import ast
import logging
import os
import queue
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from autoloop.core import module_constants
from autoloop.core.errors import AutoloopError
from autoloop.observe.console import parse_progress
from autoloop.repo.gitview import file_at, record_diff
from autoloop.store.ledger import LedgerRecord, trial_label

TRACKERS = ("wandb", "mlflow")
DONE_DIR = "trackers"
MAX_LOSS_POINTS = 2000     # a long log's loss curve is thinned to this many points
CLOSE_TIMEOUT_S = 120.0    # how long the end of a run waits for the tracker thread


class TrackerError(AutoloopError):
    """A tracker cannot be set up (not installed, bad store); one line for the user."""


@dataclass
class AttemptRun:
    """Everything one tracker run holds, gathered from the ledger record, git and the log."""

    record: LedgerRecord
    tag: str
    name: str                                   # "<tag> #7.2"
    config: dict[str, Any]
    metrics: dict[str, float]
    status: str
    crash: str | None
    diff: str
    losses: list[tuple[int, float]] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.record.status == "crash"


class Tracker(Protocol):
    name: str

    def log(self, run: AttemptRun) -> None: ...

    def close(self) -> None: ...


# ------------------------------------------------------------------------------ gathering


def _typed(source: str) -> object:
    """A constant's value as a number/bool/tuple when it is a literal, else its source text."""
    try:
        value = ast.literal_eval(source)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return source
    return value if isinstance(value, (int, float, bool, str, tuple)) else source


def loss_curve(log_text: str, limit: int = MAX_LOSS_POINTS) -> list[tuple[int, float]]:
    """(step, loss) of each progress line of a run log, thinned evenly to ``limit`` points."""
    points = []
    for line in log_text.splitlines():
        parsed = parse_progress(line)
        if "step" in parsed and "loss" in parsed:
            points.append((parsed["step"], parsed["loss"]))
    if len(points) > limit:
        stride = len(points) / limit
        points = [points[int(i * stride)] for i in range(limit - 1)] + [points[-1]]
    return points


def gather(record: LedgerRecord, root: Path, results_dir: Path, tag: str, target: str,
           settings: dict[str, Any]) -> AttemptRun:
    """The run of one attempt: constants at its commit, metrics, diff and loss curve."""
    label = trial_label(record.trial, record.attempt)
    source = file_at(root, record.commit, target) if record.commit else None
    constants = {k: _typed(v) for k, v in (module_constants.sources(source) or {}).items()} if source else {}
    config = {**constants, "autoloop": {
        "tag": tag, "trial": record.trial, "attempt": record.attempt, "label": label, "kind": record.kind,
        "proposer": record.proposer, "commit": record.commit, "parent": record.parent, "seed": record.seed,
        "worker": record.worker, "description": record.description, **settings}}
    metrics = {name: float(value) for name, value in (
        (record.metric_name, record.metric), ("training_seconds", record.training_seconds),
        ("wall_seconds", record.wall_seconds), ("memory_gb", record.memory_gb),
        ("best_" + record.metric_name, record.best_metric), ("confidence", record.confidence),
        ("noise", record.noise)) if value is not None}
    diff = record_diff(root, record) or ""
    losses: list[tuple[int, float]] = []
    if record.log_path:
        log = (results_dir / record.log_path)
        try:
            if log.resolve().is_relative_to(results_dir.resolve()):
                losses = loss_curve(log.read_text(errors="replace"))
        except OSError:
            pass
    return AttemptRun(record, tag, f"{tag} #{label}", config, metrics, record.status, record.crash, diff, losses)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())[:300]


# ------------------------------------------------------------------------------ W&B


class WandbTracker:
    """One W&B run per attempt, in group ``autoloop/<tag>``; files under ``results/wandb``."""

    name = "wandb"

    def __init__(self, results_dir: Path):
        try:
            import wandb
        except ImportError:
            raise TrackerError("--track wandb: wandb is not installed (pip install 'autoloop[wandb]')") from None
        self.wandb = wandb
        self.dir = Path(results_dir)
        self.project = os.environ.get("WANDB_PROJECT") or "autoloop"

    def log(self, run: AttemptRun) -> None:
        wandb = self.wandb
        settings = wandb.Settings(silent=True, console="off", save_code=False, x_disable_stats=True,
                                  x_save_requirements=False, disable_git=True)
        handle = wandb.init(project=self.project, group=f"autoloop/{run.tag}", job_type=run.record.kind,
                            name=run.name, config=run.config, dir=str(self.dir), reinit="create_new",
                            settings=settings)
        try:
            for step, loss in run.losses:
                handle.log({"train/loss": loss}, step=step)
            final_step = run.losses[-1][0] + 1 if run.losses else 0
            handle.log(run.metrics, step=final_step)
            handle.summary.update({"status": run.status, "crash": run.crash or "-",
                                   "reason": run.record.reason, **run.metrics})
            if run.diff:
                artifact = wandb.Artifact(_artifact_name(run), type="diff")
                with artifact.new_file("diff.patch") as f:
                    f.write(run.diff)
                handle.log_artifact(artifact)
        finally:
            handle.finish(exit_code=1 if run.failed else 0)

    def close(self) -> None:
        pass


def _artifact_name(run: AttemptRun) -> str:
    """W&B artifact names allow letters, digits, '-', '_' and '.'."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"diff-{run.tag}-{run.record.trial}-{run.record.attempt}")


# ------------------------------------------------------------------------------ MLflow


class MlflowTracker:
    """One MLflow run per attempt, in experiment ``autoloop/<tag>``."""

    name = "mlflow"

    def __init__(self, results_dir: Path, tag: str):
        # MLflow and its migrations log INFO lines on every new store: not the night's business.
        for name in ("mlflow", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise TrackerError("--track mlflow: mlflow is not installed (pip install 'autoloop[mlflow]')") from None
        store = Path(results_dir) / "mlflow"
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        self.artifacts = None
        if not uri:
            # MLflow's own defaults are files in the current folder, i.e. the repository's work
            # tree, which the scope check would take for a proposer's stray files.
            store.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{store / 'mlflow.db'}"
            self.artifacts = (store / "artifacts").as_uri()
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_name = f"autoloop/{tag}"
        self._experiment_id: str | None = None

    def _experiment(self) -> str:
        if self._experiment_id is None:
            found = self.client.get_experiment_by_name(self.experiment_name)
            self._experiment_id = found.experiment_id if found else self.client.create_experiment(
                self.experiment_name, artifact_location=self.artifacts)
        return self._experiment_id

    def log(self, run: AttemptRun) -> None:
        from mlflow.entities import Metric, Param

        record = run.record
        tags = {"status": run.status, "crash": run.crash or "-", "kind": record.kind, "trial": record.trial,
                "attempt": record.attempt, "commit": record.commit or "-", "reason": _one_line(record.reason)}
        created = self.client.create_run(self._experiment(), run_name=run.name,
                                         tags={k: str(v) for k, v in tags.items()},
                                         start_time=int(record.started_at * 1000))
        run_id = created.info.run_id
        t = int(record.ended_at * 1000)
        try:
            params = [Param(k, str(v)[:6000]) for k, v in _flatten(run.config).items()]
            metrics = [Metric("train_loss", loss, t, step) for step, loss in run.losses]
            final_step = run.losses[-1][0] + 1 if run.losses else 0
            metrics += [Metric(k.replace("/", "_"), v, t, final_step) for k, v in run.metrics.items()]
            # log_batch takes at most 100 params and 1000 metrics a call.
            for i in range(0, len(params), 100):
                self.client.log_batch(run_id, params=params[i:i + 100])
            for i in range(0, len(metrics), 1000):
                self.client.log_batch(run_id, metrics=metrics[i:i + 1000])
            if run.diff:
                self.client.log_text(run_id, run.diff, "diff.patch")
        except BaseException:
            self.client.set_terminated(run_id, "FAILED")
            raise
        self.client.set_terminated(run_id, "FAILED" if run.failed else "FINISHED", end_time=t)

    def close(self) -> None:
        pass


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# ------------------------------------------------------------------------------ the thread


def open_tracker(name: str, results_dir: Path, tag: str) -> Tracker:
    if name == "wandb":
        return WandbTracker(results_dir)
    if name == "mlflow":
        return MlflowTracker(results_dir, tag)
    raise TrackerError(f"--track: unknown tracker {name!r} (wandb or mlflow)")


def attempt_key(tag: str, record: LedgerRecord) -> str:
    return f"{tag} {record.trial}.{record.attempt}"


class Tracking:
    """The trackers of one run, fed from one background thread (see the module docstring)."""

    def __init__(self, trackers: list[Tracker], root: Path, results_dir: Path, tag: str, target: str,
                 settings: dict[str, Any], warn: Callable[[str], None]):
        self.trackers = trackers
        self.root, self.results_dir, self.tag, self.target = Path(root), Path(results_dir), tag, target
        self.settings = settings
        self.warn = warn
        self.done_dir = self.results_dir / DONE_DIR
        self.done_dir.mkdir(parents=True, exist_ok=True)
        self.done = {t.name: self._read_done(t.name) for t in trackers}
        self._queue: queue.Queue[LedgerRecord | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="autoloop-trackers", daemon=True)
        self._thread.start()

    def _read_done(self, name: str) -> set[str]:
        try:
            return set((self.done_dir / f"{name}.done").read_text().splitlines())
        except OSError:
            return set()

    def _mark_done(self, name: str, key: str) -> None:
        self.done[name].add(key)
        with open(self.done_dir / f"{name}.done", "a") as f:
            f.write(key + "\n")

    def recorded(self, record: LedgerRecord) -> None:
        """Hand a just-appended record to the trackers (returns at once)."""
        if record.status != "skip":
            self._queue.put(record)

    def catch_up(self, records: list[LedgerRecord]) -> int:
        """Queue every judged attempt some tracker has not logged yet; returns how many."""
        missing = [r for r in records if r.status != "skip"
                   and any(attempt_key(self.tag, r) not in self.done[t.name] for t in self.trackers)]
        for record in missing:
            self._queue.put(record)
        return len(missing)

    def _work(self) -> None:
        while True:
            record = self._queue.get()
            if record is None:
                return
            key = attempt_key(self.tag, record)
            try:
                run = gather(record, self.root, self.results_dir, self.tag, self.target, self.settings)
            except Exception as e:  # a tracker never stops the loop
                self.warn(f"track: could not gather #{trial_label(record.trial, record.attempt)}: {_one_line(e)}")
                continue
            for tracker in self.trackers:
                if key in self.done[tracker.name]:
                    continue
                try:
                    tracker.log(run)
                    self._mark_done(tracker.name, key)
                except Exception as e:  # a tracker never stops the loop: one warning line
                    self.warn(f"track {tracker.name}: could not log #{trial_label(record.trial, record.attempt)} "
                              f"({type(e).__name__}: {_one_line(e)}); the loop goes on")

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Let the thread finish what is queued (up to ``timeout``), then close the trackers."""
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            left = self._queue.qsize()
            self.warn(f"track: still logging after {timeout:.0f}s; {left} attempt(s) left for the next start")
            return
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as e:  # a tracker never stops the loop
                self.warn(f"track {tracker.name}: closing failed ({_one_line(e)})")
