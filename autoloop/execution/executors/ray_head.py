"""The Ray cluster's head, seen from the orchestrator: whether it still answers, and how the
night ends when it does not.

The orchestrator is a Ray driver (``ray.init`` in its process). Ray does not survive its
head for long: the head holds the cluster's GCS, and without GCS fault tolerance (an external
Redis, rare outside KubeRay's option for it) a new head is a new cluster, without the old
one's actors. When the GCS stops answering, Ray's core worker in the driver process ends the
whole process itself once ``gcs_rpc_server_reconnect_timeout_s`` has passed (60 s by default;
``RAY_gcs_rpc_server_reconnect_timeout_s`` in the environment): exit status 1, ``Failed to
connect to GCS within 60 seconds ... The program will terminate.`` on stderr, 61.5 s after the
head's session was killed (Ray 2.60, measured with the driver on the head's node: its calls to
a trial's actor on a worker node answered until then). Nothing of autoloop's runs at that end:
no line, no clean stop (docs/clusters.md, "When the head goes away").

So the follow loop asks :class:`HeadWatch` at each poll. It tries a TCP connection to the
head's GCS port (a dead head refuses it at once, a lost machine lets it time out); once
nothing has answered for a third of Ray's own limit (20 s by default), :meth:`HeadWatch.check`
raises :class:`HeadGone`. The executor then asks the trial's actor to stop (a call that goes
to the actor's node directly, not through the GCS: the trial's tree is ended there while that
node lives), disconnects from Ray (:func:`leave`, bounded: Ray's shutdown may wait on the dead
GCS), and the night ends with the one line of :class:`HeadGone` and exit status 75. The
attempt stays in flight in state.json, as after a kill -9: ``--resume`` against the head once
it is back finds the attempt's actor gone with the old cluster and records the attempt
``interrupted (orchestrator stopped during running)``, never against the change, and runs it
again once (docs/failures.md). That is also what happens where Ray ended the process first.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

from autoloop.core.durations import format_duration
from autoloop.execution.executors import ExecutorError

# Ray's default for gcs_rpc_server_reconnect_timeout_s: how long its driver outlives its head.
RAY_RECONNECT_S = 60.0
GONE_FRACTION = 1 / 3      # the head is called gone after this share of Ray's limit without an answer
PROBE_TIMEOUT_S = 2.0      # a connection to a machine that is gone times out instead of being refused
PROBE_EVERY_S = 1.0
# Ray's shutdown, bounded: past this the process goes on without it. Without its head, Ray 2.60's
# took 5.0 s here (its call to the dead GCS timing out).
LEAVE_WAIT_S = 10.0
# EX_TEMPFAIL (sysexits.h): a temporary failure, the same command works later.
EXIT_HEAD_GONE = 75


class HeadGone(ExecutorError):
    """The Ray cluster's head stopped answering: the night stops, ``--resume`` continues it."""

    exit_status = EXIT_HEAD_GONE


def ray_reconnect_s(environ: dict[str, str] | os._Environ[str] | None = None) -> float:
    """How long Ray lets its driver wait for the head (``RAY_gcs_rpc_server_reconnect_timeout_s``)."""
    env = os.environ if environ is None else environ
    try:
        return max(float(env.get("RAY_gcs_rpc_server_reconnect_timeout_s", "")), 1.0)
    except ValueError:
        return RAY_RECONNECT_S


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def answers(address: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the head's GCS port takes a connection."""
    try:
        with socket.create_connection(_host_port(address), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


class HeadWatch:
    """Whether the head at ``address`` has answered in the last ``gone_after_s`` seconds, asked at
    most once every ``PROBE_EVERY_S`` (one watch per head, shared by the night's slots)."""

    def __init__(self, address: str, gone_after_s: float | None = None):
        self.address = address
        self.gone_after_s = gone_after_s if gone_after_s is not None else ray_reconnect_s() * GONE_FRACTION
        self._lock = threading.Lock()
        self._answered = time.monotonic()
        self._asked = 0.0
        self._answers = True
        self.gone: HeadGone | None = None   # once gone, gone: a head that comes back is a new cluster

    def check(self) -> None:
        """HeadGone when the head has not answered for ``gone_after_s``."""
        if self.gone is not None:
            raise self.gone
        with self._lock:
            now = time.monotonic()
            if now - self._asked >= PROBE_EVERY_S:
                self._asked = now
                self._answers = answers(self.address)
                if self._answers:
                    self._answered = time.monotonic()
            silent = time.monotonic() - self._answered
        if not self._answers and silent >= self.gone_after_s:   # gone by the last look, not by its age
            raise self._gone(silent)

    def failed_without(self) -> HeadGone | None:
        """After a Ray call failed: HeadGone when the head does not answer now either (a driver
        whose raylet was the head's sees its calls fail before the limit), else None."""
        if self.gone is None and not answers(self.address):
            self._gone(time.monotonic() - self._answered)
        return self.gone

    def _gone(self, silent: float) -> HeadGone:
        self.gone = self.gone or HeadGone(
            f"the Ray cluster's head at {self.address} is gone (no answer for {format_duration(round(silent))}): the "
            "night stops here, the running trial to be run again; autoloop run --resume continues once the "
            "head is back")
        return self.gone


_watches: dict[str, HeadWatch] = {}
_watches_lock = threading.Lock()


def watch(address: str) -> HeadWatch:
    with _watches_lock:
        return _watches.setdefault(address, HeadWatch(address))


def leave(actors: Iterable[Any]) -> None:
    """Without the head: ask each actor to stop its trial (a call to the actor's node, which
    needs no GCS: the trial's tree is ended there if that node still runs), then disconnect
    from Ray, within LEAVE_WAIT_S whatever Ray does."""
    import ray

    def _go() -> None:
        with contextlib.suppress(Exception):
            asked = [actor.stop.remote() for actor in actors]
            if asked:   # sent before the shutdown drops what is not sent yet
                ray.wait(asked, num_returns=len(asked), timeout=2.0)
        with contextlib.suppress(Exception):
            ray.shutdown()

    done = threading.Thread(target=_go, name="autoloop-ray-leave", daemon=True)
    done.start()
    done.join(LEAVE_WAIT_S)
