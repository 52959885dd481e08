"""Helpers for the tests of watching a night: a scripted train.py stand-in, a queue of
whole-file changes, the real CLI, and a dashboard server started as `autoloop dashboard`.

The stand-in's val_bpb is A + B, so every verdict is known in advance. It prints progress
lines like the real train.py (the dashboard's live log and the trackers' loss curve read
them), and a change with HOLD = True does not finish until the file results/go exists:
a test decides when that attempt is recorded, without any timing assumption.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from helpers.git import init_repo

FAKE = '''\
"""A scripted stand-in for train.py: val_bpb = A + B."""
A = 1.0
B = 2.0
HOLD = False   # wait for results/go before finishing

import os, pathlib, time

for step in range(1, 4):
    print(f"step {step:05d} ({100 * step / 3:.1f}%) | loss: {3.0 / step:.4f}", flush=True)
if HOLD:
    go = pathlib.Path(os.environ["AUTOLOOP_RESULT"]).parent.parent / "go"
    give_up = time.time() + 120
    while not go.exists() and time.time() < give_up:
        time.sleep(0.05)
print("---")
print(f"val_bpb: {A + B:.6f}")
print("training_seconds: 0.5")
'''


def fake(**values) -> str:
    text = FAKE
    for name, value in values.items():
        text, n = re.subn(rf"^{name} = [^#\n]*", f"{name} = {value!r} ", text, count=1, flags=re.M)
        assert n == 1, name
    return text


def fake_repo(tmp: Path) -> Path:
    return init_repo(tmp / "repo", {"train.py": fake()})


def queue(repo: Path, name: str, source: str, description: str | None = None) -> None:
    folder = repo / "results" / "queue"
    folder.mkdir(parents=True, exist_ok=True)
    header = f"# autoloop: {description}\n" if description else ""
    (folder / name).write_text(header + source)


def run_args(*extra: str, tag: str = "t") -> list[str]:
    return [sys.executable, "-m", "autoloop.cli", "run", "--budget", "1", "--timeout", "60", "--proposer", "queue",
            "--tag", tag, "--device", "cpu", "--command", f"{sys.executable} train.py", "--noise-runs", "0",
            "--sanity-bound", "0", *extra]


def cli_env(data_dir: Path, **extra: str) -> dict:
    return {**os.environ, "AUTOLOOP_DATA_DIR": str(data_dir), "AUTOLOOP_DEVICE": "cpu", **extra}


def run_night(repo: Path, data_dir: Path, *extra: str, env: dict | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(run_args(*extra), cwd=repo, env={**cli_env(data_dir), **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)
    return proc


class DashboardProcess:
    """`autoloop dashboard --port 0 ...` as a real subprocess; .url is what it printed."""

    def __init__(self, repo: Path, *args: str, env: dict | None = None):
        self.proc = subprocess.Popen([sys.executable, "-m", "autoloop.cli", "dashboard", "--port", "0", *args],
                                     cwd=repo, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip("\n"))
            if line.startswith("read-only"):
                break
        urls = [line.split(" ", 1)[1] for line in self.lines if line.startswith("dashboard: ")]
        if not urls:
            self.stop()
            raise AssertionError("the dashboard did not start: " + "\n".join(self.lines))
        self.urls = urls
        self.url = urls[-1]    # 127.0.0.1 comes last when several are printed
        self.port = int(re.search(r":(\d+)/", self.url).group(1))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> DashboardProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
