"""A trial flooding stdout: how fast the runner drains it and what it costs the orchestrator.

    python benchmarks/flood.py [--mb 400] [--cap-mb 32]

For a child writing MB of 1 KiB lines as fast as it can, then exiting:

drained           MB/s from run_process() called to returned (the child's own writing speed
                  bounds it: compare with the bare pipe read into /dev/null)
orchestrator CPU  CPU seconds of this process (the reader thread, sampling, the log) per
                  wall second and per GB drained
log               the size of the log file afterwards, uncapped and capped
timeout lag       a child flooding forever under a 2 s hard timeout: how long after the
                  deadline run_process returned (the flood must not stall the supervision)

Prints figures only; nothing is asserted (the numbers depend on the machine and its load).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from autoloop.execution.runner import READ_CHUNK, RunSpec, run_process

FLOOD = ("import sys\nblock = (b'x' * 1023 + b'\\n') * 1024\nfor _ in range({mb}):\n"
         "    sys.stdout.buffer.write(block)\nsys.stdout.buffer.flush()\nprint('val_bpb: 1.0')\n")


def bare(mb: int) -> tuple[float, float]:
    """(wall s, CPU s of this process) for Popen + reading the pipe in 1 MiB reads, discarded."""
    cpu, wall = time.process_time(), time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", FLOOD.format(mb=mb)], stdout=subprocess.PIPE)
    while proc.stdout.read1(READ_CHUNK):
        pass
    proc.wait()
    return time.monotonic() - wall, time.process_time() - cpu


def ours(workdir: Path, mb: int, cap_bytes: int | None) -> tuple[float, float, int, int]:
    """(wall s, CPU s, log bytes, bytes cut) for run_process on the same child."""
    log = workdir / f"flood-{cap_bytes}.log"
    cpu, wall = time.process_time(), time.monotonic()
    outcome = run_process(RunSpec(command=[sys.executable, "-c", FLOOD.format(mb=mb)], cwd=workdir,
                                  log_path=log, log_cap_bytes=cap_bytes))
    elapsed, used = time.monotonic() - wall, time.process_time() - cpu
    assert outcome.metric == 1.0, outcome.log_tail
    return elapsed, used, log.stat().st_size, outcome.log_cut_bytes


def timeout_lag(workdir: Path, cap_bytes: int) -> tuple[float, int]:
    """(seconds past the 2 s deadline, bytes drained) for a child that floods until killed."""
    forever = "import sys\nblock = (b'x' * 1023 + b'\\n') * 1024\nwhile True:\n    sys.stdout.buffer.write(block)\n"
    started = time.monotonic()
    outcome = run_process(RunSpec(command=[sys.executable, "-c", forever], cwd=workdir,
                                  log_path=workdir / "forever.log", budget_s=1, timeout_s=2, grace_s=1,
                                  log_cap_bytes=cap_bytes))
    assert outcome.killed_reason == "timeout", outcome
    return time.monotonic() - started - 2, outcome.log_cut_bytes + (workdir / "forever.log").stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=400, help="MiB the child writes (default 400)")
    parser.add_argument("--cap-mb", type=float, default=32.0, help="log cap of the capped run (default 32)")
    args = parser.parse_args()
    print(f"{psutil.cpu_count()} CPUs, python {sys.version.split()[0]}; the child writes {args.mb} MiB of 1 KiB lines")
    wall, cpu = bare(args.mb)
    print(f"{'bare pipe read, discarded'.ljust(25)}: {args.mb / wall:7.0f} MiB/s   CPU {cpu / wall:.2f} s/s, "
          f"{cpu / args.mb * 1024:.2f} s per GiB")
    with tempfile.TemporaryDirectory() as tmp:
        caps = (("run_process, no cap", None), (f"run_process, cap {args.cap_mb:g} MiB", int(args.cap_mb * 2**20)))
        for label, cap in caps:
            wall, cpu, size, cut = ours(Path(tmp), args.mb, cap)
            print(f"{label.ljust(25)}: {args.mb / wall:7.0f} MiB/s   CPU {cpu / wall:.2f} s/s, "
                  f"{cpu / args.mb * 1024:.2f} s per GiB; "
                  f"log {size / 2**20:.1f} MiB, {cut / 2**20:.1f} MiB cut")
        lag, drained = timeout_lag(Path(tmp), int(args.cap_mb * 2**20))
        print(f"{'timeout lag, flooding'.ljust(25)}: returned {lag:.2f} s after the 2 s deadline "
              f"(SIGTERM, up to 1 s grace, SIGKILL), {drained / 2**20:.0f} MiB drained meanwhile")


if __name__ == "__main__":
    main()
