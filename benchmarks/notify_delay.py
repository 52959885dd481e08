"""What --notify costs a night when its target works, fails, refuses or never answers.

Runs the same short night (the real CLI, a scripted train.py whose val_bpb is A + B, a
queue of changes of which each second one is a new best) once per target and prints its
wall seconds, when its last attempt was recorded (the trials' part: the rest is the end
waiting for queued notifications), how many requests reached the target and its warning:

* none:     no --notify (the reference)
* ok:       a local webhook answering 200 (apprise's json:// form)
* failing:  the same answering 500 to everything
* refused:  a port nobody listens on
* hanging:  a server that accepts and never answers (apprise's own 4 s read timeout)

Delivery runs on a background thread, so trials never wait for it; what the end of the
night waits for at most is notify.CLOSE_TIMEOUT_S (15 s) for the events still queued.

    python benchmarks/notify_delay.py                 # 6 changes
    python benchmarks/notify_delay.py --changes 10
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FAKE = '''A = 1.0
B = 2.0
print("---")
print(f"val_bpb: {A + B:.6f}")
print("training_seconds: 0.5")
'''


class Webhook:
    def __init__(self, status: int):
        self.count = 0
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.count += 1
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"json://127.0.0.1:{self.server.server_port}/night"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Silent:
    """Accepts connections and never answers."""

    def __init__(self):
        self.count = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.held: list[socket.socket] = []
        self.url = f"json://127.0.0.1:{self.sock.getsockname()[1]}/night"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.count += 1
            self.held.append(conn)

    def close(self):
        self.sock.close()
        for conn in self.held:
            conn.close()


def repo_with_queue(tmp: Path, changes: int) -> Path:
    repo = tmp / "repo"
    repo.mkdir(parents=True)
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
    git("init", "-q", "-b", "main")
    (repo / "train.py").write_text(FAKE)
    (repo / ".gitignore").write_text("results/\n")
    git("add", ".")
    git("-c", "user.name=b", "-c", "user.email=b@b.invalid", "commit", "-qm", "base")
    folder = repo / "results" / "queue"
    folder.mkdir(parents=True)
    for i in range(changes):
        a = 1.0 - 0.1 * (i // 2 + 1) if i % 2 == 0 else 1.0 - 0.1 * (i // 2 + 1) + 5   # a best, then a discard
        (folder / f"{i:02d}.py").write_text(f"# autoloop: change {i}\n" + FAKE.replace("A = 1.0", f"A = {a}"))
    return repo


def night(tmp: Path, data: Path, changes: int, url: str | None) -> tuple[float, float, list[str]]:
    repo = repo_with_queue(tmp, changes)
    args = [sys.executable, "-m", "autoloop.cli", "run", "--budget", "1", "--timeout", "60", "--proposer", "queue",
            "--tag", "b", "--device", "cpu", "--command", f"{sys.executable} train.py", "--noise-runs", "0",
            "--sanity-bound", "0"] + (["--notify", url, "--notify-every", "0"] if url else [])
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(data), "AUTOLOOP_DEVICE": "cpu"}
    t0, wall0 = time.monotonic(), time.time()
    proc = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stdout + proc.stderr)
    records = [json.loads(line) for line in (repo / "results" / "ledger.jsonl").read_text().splitlines()]
    last = max(r["ended_at"] for r in records) - wall0   # the last attempt recorded, from the start
    return took, last, [line for line in proc.stdout.splitlines() if "notify" in line and "warning" in line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=6)
    args = parser.parse_args()
    from autoloop.data import CorpusSpec, prepare

    with tempfile.TemporaryDirectory(prefix="autoloop-notify-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        data = tmp / "data"
        prepare(CorpusSpec(val_bytes=16 * 1024, audit_bytes=4 * 1024), data)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            refused = f"json://127.0.0.1:{s.getsockname()[1]}/night"   # closed when the block ends
        targets = {"none": None, "ok": Webhook(200), "failing": Webhook(500), "refused": refused, "hanging": Silent()}
        print(f"{'target':<9} {'wall s':>7} {'last attempt s':>14} {'requests':>8}  warnings")
        for i, (name, target) in enumerate(targets.items()):
            url = target if isinstance(target, str) or target is None else target.url
            took, last, warnings = night(tmp / str(i), data, args.changes, url)
            count = "-" if isinstance(target, str) or target is None else str(target.count)
            said = warnings[0].split("warning: ", 1)[-1][:100] if warnings else "-"
            print(f"{name:<9} {took:7.1f} {last:14.1f} {count:>8}  {said}", flush=True)
            if target is not None and not isinstance(target, str):
                target.close()


if __name__ == "__main__":
    main()
