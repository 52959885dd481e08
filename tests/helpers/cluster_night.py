"""What the tests of every engine that places trials (Slurm, Ray) share: the scripted train.py
stand-ins a placed trial runs, a bounded wait, `autoloop` started as a real process of its own
session (so that a test can kill -9 it or send it Ctrl-C), and a cluster served from the command
line until a signal ends it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def fake_train(value: float, action: str = "") -> str:
    """A train.py that runs ``action`` and then reports ``value`` on stdout."""
    return f"VALUE = {value!r}\n" + action + 'print("---")\nprint(f"val_bpb: {VALUE:.6f}")\n'


def hang_train(marker: Path) -> str:
    """Writes its pid to ``marker`` once running, then hangs."""
    return fake_train(0.8, f"import os, pathlib, time\npathlib.Path({str(marker)!r}).write_text(str(os.getpid()))\n"
                           "print('step 00001 (1.0%) | loss: 9.0', flush=True)\ntime.sleep(300)\n")


def releasable_train(value: float, marker: Path, release: Path, nonce: str = "os.environ['AUTOLOOP_NONCE']") -> str:
    """Starts (marker), waits for ``release``, then reports ``value`` as autoloop.evaluate does:
    a result file with the trial's nonce (or ``nonce``, a forged one), and the line on stdout."""
    return fake_train(value, f"import json, os, pathlib, time\npathlib.Path({str(marker)!r}).write_text('x')\n"
                             f"while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.1)\n"
                             "pathlib.Path(os.environ['AUTOLOOP_RESULT']).write_text(json.dumps("
                             f"{{'val_bpb': VALUE, 'nonce': {nonce}}}))\n")


def wait_for(what: str, ready: Callable[[], Any], timeout: float = 120) -> None:
    """Poll until ready() (a bound against hangs, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def start_autoloop(repo: Path, data_dir: Path, args: list[str], out: Path | None = None) -> subprocess.Popen:
    """``autoloop ARGS`` in a session of its own; its output piped, or written to ``out`` to be
    read while it runs."""
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(data_dir), "AUTOLOOP_DEVICE": "cpu"}
    command = [sys.executable, "-m", "autoloop.cli", *args]
    if out is None:
        return subprocess.Popen(command, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
    with open(out, "w") as f:
        return subprocess.Popen(command, cwd=repo, env=env, stdout=f, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)


def serve_until_signal(start: Callable[[], Any], export: Callable[[Any], str]) -> None:
    """Run as a script: the cluster ``start()`` makes, the line ``export(cluster)`` that points a
    shell at it printed, kept until Ctrl-C or SIGTERM, then stopped and removed. The handlers come
    first, so that a signal during the start still ends in the stop; SIGINT is set explicitly, as
    a shell's background job starts with it ignored."""
    def _end(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _end)
    signal.signal(signal.SIGINT, _end)
    cluster = None
    try:
        cluster = start()
        print(f"{export(cluster)}   # Ctrl-C (or SIGTERM) ends the cluster", flush=True)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        # One stop is enough: `timeout` sends its signal to the child and then to the whole group.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(cluster.dir, ignore_errors=True)
