"""Opening a night: everything that must hold before the first attempt, in one place.

``open_night`` is the one context manager that ``autoloop run`` (any number of workers)
and ``autoloop trial`` enter. In order, each step relying on the ones before it:

1. torch is new enough for the default train.py (core/torch_floor.py), ``--isolate`` works
   here, the workspace is a git work tree with the target committed and ``results/``
   git-ignored, the executor can run trials;
2. the workspace lock (a second orchestrator is refused at once) and the signal handlers
   (SIGINT/SIGTERM end the current attempt cleanly, recorded);
3. the ledger's torn tail repaired; the arbiter made over it;
4. recovery (``recovery.py``): every attempt a kill interrupted is finished and recorded;
   ``run`` does this on ``--resume`` and refuses to start over an interrupted night without it;
5. the branch: ``run`` starts ``autoloop/<tag>`` (or resumes it), ``trial`` works on the
   checked-out one; the main checkout is put at the ledger's best;
6. the data prepared and checked against the baseline's fingerprint, then the integrity
   snapshot of the measurement's inputs;
7. ``run``: the night's facts written and the study's earlier nights read (study.py);
8. the observers (git notes, trackers) caught up with the ledger and attached to the arbiter.

What comes out is a :class:`~autoloop.engine.night.Night`: the collaborators the engine is built from.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Literal

from filelock import FileLock, Timeout

from autoloop.config.settings import Settings
from autoloop.core import torch_floor
from autoloop.core.errors import NightError
from autoloop.core.keep import Rules
from autoloop.core.layout import TAG_FILES, Layout, branch_name, tag_of_branch
from autoloop.data import CorpusSpec, ensure_prepared
from autoloop.engine import recovery
from autoloop.engine.arbiter import Arbiter
from autoloop.engine.night import Night, Stop
from autoloop.engine.study import open_study
from autoloop.execution.cgroups import containment, sweep_empty_groups
from autoloop.execution.executors import make_executor
from autoloop.execution.integrity import open_snapshot
from autoloop.execution.isolate import isolation_available
from autoloop.observe.console import Console
from autoloop.observe.observers import open_observers, open_telling
from autoloop.repo.workspace import Workspace
from autoloop.repo.worktrees import ensure_worktrees_ignored
from autoloop.store import queries
from autoloop.store.ledger import Ledger
from autoloop.store.state import load_state

Purpose = Literal["run", "trial", "verify"]


@contextmanager
def open_night(settings: Settings, workdir: Path, console: Console, purpose: Purpose = "run") -> Iterator[Night]:
    """Hold the workspace for one night (see the module docstring for the steps)."""
    check_isolation(settings)
    check_torch(settings)
    ws = Workspace(Path(workdir), settings.target)
    try:
        ws.check_target()
        ws.ensure_results_ignored()
        layout = Layout(ws.results_dir)
        tag = _tag(settings, layout, ws, purpose)
        # The loop's other branches (workers', look-ahead's: autoloop/<tag>-...) move while a
        # proposer works in the main checkout: reconcile must neither restore them nor report
        # them as the agent's doing (reconcile.snapshot and _restore_refs skip these refs).
        ws.foreign_refs = (f"refs/heads/{branch_name(tag)}-",)
        executor = make_executor(settings, ws.root)
        stop = Stop()
        with workspace_lock(layout), graceful_signals(stop, console):
            ledger = Ledger(layout.root)
            report = ledger.repair()
            if report:
                console.line(f"ledger: {report}")
            ledger.sole_writer, ledger.notice = True, console.line   # the workspace lock is held
            for line in ledger.integrity_lines():
                console.line(f"ledger: {line}")
            console.line(f"containment: {containment()[1]}")
            swept = sweep_empty_groups()   # left by kills this workspace's recovery never saw
            if swept:
                console.line(f"containment: removed {swept} empty cgroup(s) left by earlier kills")
            if executor.plan:
                console.line(executor.plan)   # what each trial's job asks the cluster for, and why
            arbiter = Arbiter(ledger, ws, Rules.of(settings))
            night = Night(settings, console, ws, layout, ledger, arbiter, tag, stop, executor)
            if settings.workers > 1 or layout.worker_states():
                ensure_worktrees_ignored(ws)
            _recover(night, purpose)
            {"run": _start_branch, "trial": _trial_branch, "verify": _verify_branch}[purpose](night)
            prepare_data(night, reuse_snapshot=purpose == "trial")
            if purpose == "run":
                night.memory = open_study(settings, ws, layout.root, tag, night.fingerprint, console.line)
            with watched(night, purpose):
                yield night
    finally:
        ws.close()


@contextmanager
def watched(night: Night, purpose: Purpose = "run") -> Iterator[None]:
    """Git notes and the --track trackers: brought up to date with the ledger (recovery's
    records included) before the first new attempt, then told of each record as the arbiter
    appends it; at the end the trackers finish what is queued. A run's events (--notify,
    --on) are told as they happen, its end last."""
    # The arbiter answers records() from memory: no re-reading of the ledger per record.
    s = night.settings
    telling = open_telling(night.ws.root, night.layout.root, night.tag, night.arbiter, night.console,
                           list[str](s.notify), s.notify_every, dict[str, str](s.hooks),
                           s.hook_timeout) if purpose == "run" else None
    observers = open_observers(night.ws.root, night.layout.root, night.tag, night.arbiter, night.console,
                               list[str](s.track), s.target, {"budget_s": s.budget, "direction": s.direction},
                               telling)
    observers.catch_up()
    night.arbiter.observers.append(observers.recorded)
    error: BaseException | None = None
    try:
        yield
    except BaseException as e:
        error = e
        raise
    finally:
        night.arbiter.observers.remove(observers.recorded)
        # The stop's reason as the scheduler stored it; an error that escaped is the cause
        # (state.json may still hold an earlier run's reason when it came before the scheduler's).
        observers.ended(None if error is not None else load_state(night.layout.root).stop_reason, error)
        observers.close()


def check_torch(settings: Settings) -> None:
    """The default train.py's torch floor, before anything starts: below it the first step fails."""
    too_old = torch_floor.refusal(torch_floor.installed_version()) if settings.command is None else None
    if too_old:
        raise NightError(too_old)


def check_isolation(settings: Settings) -> None:
    """--isolate where the system cannot give trials a network namespace: refuse before
    anything runs, rather than run trials with the network the user wanted them kept off."""
    if settings.isolate:
        ok, why = isolation_available()
        if not ok:
            raise NightError(f"--isolate: network namespaces are not available here ({why}); run without --isolate")


@contextmanager
def workspace_lock(layout: Layout) -> Iterator[None]:
    """Hold the workspace: a second orchestrator (or `autoloop trial`) is refused at once."""
    layout.ensure()
    lock = FileLock(str(layout.workspace_lock))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        holder = load_state(layout.root).pid
        who = f" (pid {holder})" if holder else ""
        raise NightError(f"another autoloop is already running in this workspace{who}; "
                         "watch it with `autoloop status`") from None
    try:
        yield
    finally:
        lock.release()


@contextmanager
def graceful_signals(stop: Stop, console: Console) -> Iterator[None]:
    """SIGINT/SIGTERM stop the night cleanly: the running attempts are ended and recorded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            console.line(f"{name} again: still stopping, please wait")
            return
        stop.signal = name
        stop.event.set()
        console.line(f"{name}: stopping after cleaning up the current trial")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)




def prepare_data(night: Night, reuse_snapshot: bool = False) -> None:
    """The data prepared (or found), checked against the branch's baseline, and the
    inputs snapshot's snapshot taken over harness, program.md and data. ``reuse_snapshot``
    (``autoloop trial``): keep an earlier snapshot of the same tag, since the agent that
    drives itself works between calls and a fresh one would bless what it changed."""
    info = ensure_prepared(CorpusSpec(source=night.settings.corpus), night.settings.data_dir)
    night.data_dir, night.fingerprint = info.data_dir, info.meta["fingerprint"]
    verb = "prepared" if info.built else "data"
    night.console.line(f"{verb}: {info.meta['source']} -> {info.data_dir} (fingerprint {night.fingerprint})")
    baseline = queries.baseline(night.arbiter.records())
    if baseline and baseline.fingerprint and baseline.fingerprint != night.fingerprint:
        raise NightError(f"the data changed since this branch's baseline (fingerprint {baseline.fingerprint}, "
                         f"now {night.fingerprint}); results would not be comparable: start a new --tag")
    night.inputs = open_snapshot(night.layout.root, night.ws.root, night.data_dir, night.tag, reuse=reuse_snapshot,
                             evidence_dir=night.layout.prepared_data_evidence)


# ------------------------------------------------------------------------------ the steps


def _tag(settings: Settings, layout: Layout, ws: Workspace, purpose: Purpose) -> str:
    """The tag in force. A night that began on nov29 resumes on nov30 under its own tag;
    `autoloop trial` works on the autoloop/<tag> branch that is checked out."""
    if purpose == "trial":
        return tag_of_branch(ws.current_branch()) or settings.run_tag
    previous = load_state(layout.root)
    if purpose == "verify":   # the night that is there: --tag, else the results' own, else the branch's
        return settings.tag or previous.tag or tag_of_branch(ws.current_branch()) or settings.run_tag
    if settings.resume and settings.tag is None and previous.tag:
        return previous.tag
    return settings.run_tag


def _recover(night: Night, purpose: Purpose) -> None:
    recovery.remove_stale_index_lock(night.ws, night.console)
    if purpose == "trial" or night.settings.resume:
        recovery.recover_night(night)
    elif any(state.tag == night.tag for _, state in [*recovery.interrupted(night.layout),
                                                       *recovery.interrupted_lookahead(night.layout)]):
        raise NightError("the last run of this tag was interrupted; pass --resume to recover and continue")


def _start_branch(night: Night) -> None:
    """`run`: a clean tree, a new tag's branch (the previous tag's results archived) or the
    resumed one; the main checkout at the ledger's best (a kill may have come between a
    record and the branch move)."""
    night.ws.ensure_clean()
    start = _from_branch(night)   # checked before anything moves: a wrong --from changes nothing
    if not night.settings.resume:
        _archive_other_tag(night)
        for _, path in night.layout.worker_states():
            if not load_state(night.layout.root, path.name).in_flight:
                path.unlink(missing_ok=True)
    night.ws.start_branch(night.tag, resume=night.settings.resume, start=start)
    night.arbiter.publish()


def _from_branch(night: Night) -> str | None:
    """`run --from TAG`: the earlier night's final branch, where this one starts (its kept
    changes are this night's baseline); said in one line. None without --from or on a resume."""
    earlier = night.settings.from_tag
    if earlier is None or night.settings.resume:
        return None
    if earlier == night.tag:
        raise NightError(f"--from {earlier}: that is this night's own tag; give a new --tag for the next night")
    name = branch_name(earlier)
    if not night.ws.branch_exists(earlier):
        raise NightError(f"--from {earlier}: branch {name} does not exist (autoloop history lists the nights)")
    sha = night.ws.repo.commit(name).hexsha
    night.console.line(f"from: night {earlier}'s final branch {name} at {sha[:7]}: its kept changes are this "
                       "night's baseline")
    return name


def _trial_branch(night: Night) -> None:
    """`trial`: the checked-out autoloop/<tag> branch, or a new one at HEAD (which keeps the
    edit in the work tree); another branch checked out while autoloop/<tag> exists is refused."""
    current = night.ws.current_branch()
    if tag_of_branch(current) is not None:
        return
    if night.ws.branch_exists(night.tag):
        raise NightError(f"branch {night.ws.branch_name(night.tag)} exists but {current or 'a detached HEAD'} is "
                         f"checked out; switch to it or pass --tag NAME")
    night.ws.start_branch(night.tag, resume=False)


def _verify_branch(night: Night) -> None:
    """`verify`: the night's branch, checked out and clean, at the ledger's best (verify.py
    runs its variants there and leaves it so)."""
    name = night.ws.branch_name(night.tag)
    if not night.ws.branch_exists(night.tag):
        raise NightError(f"branch {name} does not exist: nothing to verify (pass --tag TAG for another night)")
    if night.ws.current_branch() != name:
        raise NightError(f"autoloop verify works on {name}, but {night.ws.current_branch() or 'a detached HEAD'} "
                         f"is checked out; git switch {name} first")
    night.ws.ensure_clean()
    night.arbiter.publish()


def _archive_other_tag(night: Night) -> None:
    """A ledger of another tag moves to results/archive/ before a new tag starts."""
    layout = night.layout
    previous = load_state(layout.root).tag
    if not layout.ledger.exists() or previous in (None, night.tag):
        return
    dest = layout.archive / f"{previous}-{time.strftime('%Y%m%d-%H%M%S')}"
    dest.mkdir(parents=True)
    for name in TAG_FILES:
        if (layout.root / name).exists():
            os.replace(layout.root / name, dest / name)
    night.console.line(f"results of tag '{previous}' moved to {dest.relative_to(night.ws.root)}")
    night.arbiter.reload()
