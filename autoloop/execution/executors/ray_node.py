"""What runs on a Ray node for one trial: an actor that runs it with autoloop's runner.

The orchestrator (executors/ray_executor.py) makes one :class:`TrialRunner` per attempt, a
named detached actor: a driver's tasks and non-detached actors die with the driver, so a
``kill -9`` of the orchestrator would have ended the trial (and its result) with it; a
detached actor runs on, and ``autoloop run --resume`` finds it again by its name.

The trial runs in a thread of the actor through ``runner.run_process`` on the node: the
hard timeout, the memory cap, the nonce check of the result and the whole-tree kill are the
local executor's code. The outcome is kept in the actor until it is asked for (an object
returned by a call belongs to its caller and is lost with it), with the log's text when the
node does not share the orchestrator's filesystem (the result's content is in the outcome).
Without a shared filesystem the orchestrator also reads the log while the trial runs
(:meth:`TrialRunner.log_since`), so that its copy grows as the trial trains.

A trial over several nodes has one such actor per node (their placement group puts each on
a node of its own): :meth:`TrialRunner.where` says where each landed, the first one finds a
free port for the rendezvous (:meth:`TrialRunner.free_port`), then each starts its node's
share of the trial (ranks.node_share).

This module imports neither ray nor anything the node may not have beyond autoloop's core.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

from autoloop.execution.runner import RunSpec, run_process

LOG_CHUNK = 1 << 20   # the most of the log one call returns: a bounded answer whatever the trial prints


class TrialRunner:
    """One attempt's trial (or one node's share of it) on the node Ray placed it on (see the
    module docstring)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._done = threading.Event()
        self._outcome: dict[str, Any] | None = None
        self._thread: threading.Thread | None = None
        self._spec: RunSpec | None = None

    def where(self) -> dict[str, Any]:
        """Where this actor runs: the node, its address, the GPU ids Ray bound to it."""
        import ray  # on the node: Ray runs this actor, so it is there

        context = ray.get_runtime_context()
        return {"node_id": context.get_node_id(), "node_ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
                "host": socket.gethostname(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}

    def free_port(self) -> int:
        """A port free on this node now, for the rendezvous of a trial over several nodes
        (asked of the first node: a port free here says nothing of the others)."""
        with socket.socket() as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    def start(self, spec_json: str, shipped: bool) -> dict[str, Any]:
        """Start the trial; where it runs (:meth:`where`). ``shipped``: the code came in Ray's
        runtime environment (working_dir, this actor's working directory), so the paths are
        made here, not the orchestrator's."""
        spec = RunSpec.model_validate_json(spec_json)
        if shipped:
            here = Path(tempfile.mkdtemp(prefix="autoloop-trial-"))
            spec = spec.model_copy(update={"cwd": Path.cwd(), "log_path": here / "trial.log",
                                           "result_path": here / "result.json" if spec.result_path else None})
        if self._thread is None:
            self._spec = spec
            self._thread = threading.Thread(target=self._run, args=(spec, shipped), daemon=True)
            self._thread.start()
        return self.where()

    def log_since(self, offset: int, limit: int = LOG_CHUNK) -> bytes:
        """Up to ``limit`` bytes of the trial's log from byte ``offset`` (whole lines or not:
        the caller appends them as they come)."""
        if self._spec is None:
            return b""
        try:
            with open(self._spec.log_path, "rb") as f:
                f.seek(offset)
                return f.read(max(0, limit))
        except OSError:
            return b""

    def _run(self, spec: RunSpec, shipped: bool) -> None:
        try:
            outcome = run_process(spec, stop_event=self._stop)
            data = outcome.model_dump(mode="json")
            if shipped:
                data["log_text"] = Path(spec.log_path).read_text(errors="replace")
        except Exception as exc:  # the runner itself failed: said as the job's error, not lost
            data = {"node_error": f"{type(exc).__name__}: {exc}"}
        self._outcome = data
        self._done.set()

    def outcome(self, wait_s: float = 0.0, log_from: int | None = None) -> dict[str, Any] | None:
        """The trial's outcome (a RunOutcome's dict) once it has ended, else None after ``wait_s``.
        ``log_from``: the caller has the shipped log's first ``log_from`` bytes, so the answer
        carries the rest (``log_rest``) instead of the whole text, unless the runner may have
        rewritten the log (a capped log is put together at the end: then the whole text)."""
        self._done.wait(wait_s)
        if self._outcome is None or log_from is None or "log_text" not in self._outcome or self._spec is None:
            return self._outcome
        data = dict(self._outcome)
        cap = self._spec.log_cap_bytes
        try:
            raw = Path(self._spec.log_path).read_bytes()
        except OSError:
            return data
        if log_from <= len(raw) and not (cap and len(raw) >= cap // 2):
            del data["log_text"]
            data["log_rest"] = raw[log_from:]
        return data

    def stop(self) -> None:
        """End the trial (its whole tree, through the runner's stop event); the outcome follows."""
        self._stop.set()
