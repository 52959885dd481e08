"""The ray executor's side of ``autoloop run --resume`` after a kill -9 of the orchestrator.

state.json names the interrupted attempt's actor (``job_id``, ``namespace``, ``address``): a
named detached actor (executors/ray_executor.py) that ran on without its orchestrator. These are
the Ray branches of ``executors.wait_for_job``, ``cancel_job`` and ``collect_finished_job``.
Whenever recovery learns that the trial ended (:func:`wait_recorded`, :func:`cancel_recorded`),
its outcome is kept here and the actor killed at once, so that no actor is left whichever way
recovery goes next; :func:`collect_recorded` takes the kept outcome with the nonce check.

A trial over several nodes records every node's actor (``actors``, the first being ``job_id``,
whose outcome is the trial's) and their placement group (``placement_group``): whenever the
first one is done with, the others are stopped and killed and the group removed
(:func:`_end_rest`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from autoloop.execution.executors import OnProgress
from autoloop.execution.executors.node_trial import nonce_digest
from autoloop.execution.executors.ray_executor import STOP_WAIT_S, _ray, connect
from autoloop.execution.runner import RunOutcome

_collected: dict[str, dict[str, Any]] = {}   # outcomes taken from ended actors, by actor name


def _recorded_actor(job: dict[str, Any]) -> Any:
    """The recorded attempt's actor, or None where it is gone (or Ray is not there)."""
    try:
        ray = _ray()
        if not ray.is_initialized():
            connect(job.get("address"), str(job.get("namespace")))
        return ray.get_actor(str(job["job_id"]), namespace=str(job.get("namespace")))
    except Exception:  # no such actor (killed, its node died) or no cluster: nothing to find
        return None


def _end_rest(job: dict[str, Any]) -> None:
    """A multi-node attempt's other actors stopped (their trees ended on their nodes), killed,
    and its placement group removed; nothing for a one-node attempt."""
    names = [str(n) for n in job.get("actors") or []][1:]
    group = job.get("placement_group")
    if not names and not group:
        return
    ray = _ray()
    found = []
    for name in names:
        with contextlib.suppress(Exception):   # gone already (its node died, or killed)
            found.append(ray.get_actor(name, namespace=str(job.get("namespace"))))
    for actor in found:
        with contextlib.suppress(Exception):
            actor.stop.remote()
    for actor in found:
        with contextlib.suppress(Exception):
            ray.get(actor.outcome.remote(STOP_WAIT_S), timeout=STOP_WAIT_S + 30)
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
    if group:
        with contextlib.suppress(Exception):   # a group is found by name in the night's namespace
            ray.util.remove_placement_group(ray.util.get_placement_group(str(group)))


def wait_recorded(job: dict[str, Any], until: float, stop_event: threading.Event | None = None,
                  on_progress: OnProgress | None = None) -> bool:
    """Wait for the recorded actor's trial to end; True when it has (or the actor is gone).
    The ended trial's outcome is kept here and its actor killed at once, so that no actor is
    left whatever recovery does next (:func:`collect_recorded` takes the outcome)."""
    ray = _ray()
    actor = _recorded_actor(job)
    if actor is None:
        _end_rest(job)
        return True
    name = str(job.get("job_id"))
    if on_progress is not None:
        with contextlib.suppress(Exception):
            on_progress(f"ray actor {name}")
    while time.time() < until:
        if stop_event is not None and stop_event.is_set():
            return False
        try:
            data = ray.get(actor.outcome.remote(1.0), timeout=120)
        except ray.exceptions.RayActorError:
            _end_rest(job)
            return True   # it died: nothing to collect, the attempt is recorded interrupted
        except ray.exceptions.GetTimeoutError:
            continue
        if data is not None:
            _collected[name] = data
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            _end_rest(job)
            return True
    return False


def cancel_recorded(job: dict[str, Any]) -> str | None:
    """End the recorded actor. A finished one's outcome is kept here first, so that
    :func:`collect_recorded` can still take it: no actor is left either way."""
    ray = _ray()
    actor = _recorded_actor(job)
    name = job.get("job_id")
    if actor is None:
        _end_rest(job)
        return None
    try:
        data = ray.get(actor.outcome.remote(0.0), timeout=120)
    except Exception:  # dead or not answering: killed below
        data = None
    if isinstance(data, dict):
        _collected[str(name)] = data
        said = f"ray actor {name} of the interrupted trial had finished; its outcome kept, the actor ended"
    else:
        with contextlib.suppress(Exception):
            actor.stop.remote()
            ray.get(actor.outcome.remote(STOP_WAIT_S), timeout=STOP_WAIT_S + 30)
        said = f"cancelled ray actor {name} (its trial's tree ended on its node)"
    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)
    _end_rest(job)
    return said


def collect_recorded(job: dict[str, Any]) -> RunOutcome | None:
    """The outcome of the recorded actor's trial when it finished by itself and can be trusted:
    ended with a metric, its result carrying the nonce recorded at submission. None otherwise."""
    if not job.get("nonce_sha256"):
        return None
    name = str(job.get("job_id"))
    data = _collected.pop(name, None)
    if data is None:
        ray = _ray()
        actor = _recorded_actor(job)
        if actor is None:
            _end_rest(job)
            return None
        try:
            data = ray.get(actor.outcome.remote(0.0), timeout=120)
        except Exception:  # died meanwhile: nothing to take
            data = None
        with contextlib.suppress(Exception):
            if data is not None:
                ray.kill(actor, no_restart=True)
        if data is not None:
            _end_rest(job)
    if not isinstance(data, dict) or "node_error" in data:
        return None
    data = {k: v for k, v in data.items() if k not in ("log_text", "log_rest")}
    try:
        outcome = RunOutcome.model_validate(data)
    except Exception:  # not an outcome: nothing to collect
        return None
    if (outcome.metric is None or outcome.killed_reason or outcome.signal is not None
            or nonce_digest((outcome.result or {}).get("nonce")) != job["nonce_sha256"]):
        return None
    kept = {k: v for k, v in job.items() if k != "nonce_sha256"}
    return outcome.model_copy(update={"job": {**kept, "job_state": "FINISHED", "collected": True}})
