"""The runner's own overhead per trial on this machine, next to a bare subprocess.

    python benchmarks/runner_overhead.py [--repeat 20] [--sample-seconds 10]

launch -> first byte   run_process() called -> first output line seen by on_progress
                       (bare: Popen() called -> first line read from the pipe)
exit -> outcome        the child's last instruction (it prints CLOCK_MONOTONIC, then os._exit)
                       -> run_process() returned (bare: pipe drained and wait() returned)
sampling CPU           CPU seconds this process spends per wall second while a child sleeps
                       (sampling, timeout checks, the reader thread)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from autoloop.execution.runner import RunSpec, run_process

FIRST_BYTE = "import sys; sys.stdout.write('step 0\\n'); sys.stdout.flush()"
EXIT_STAMP = "import os, time; print('exit', time.monotonic(), flush=True); os._exit(0)"


def runner_first_byte(workdir: Path) -> float:
    seen: list[float] = []
    started = time.monotonic()
    run_process(RunSpec(command=[sys.executable, "-c", FIRST_BYTE], cwd=workdir, log_path=workdir / "fb.log"),
              on_progress=lambda line: seen.append(time.monotonic()))
    return seen[0] - started


def bare_first_byte(workdir: Path) -> float:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", FIRST_BYTE], cwd=workdir, stdout=subprocess.PIPE,
                            start_new_session=True)
    proc.stdout.readline()
    first = time.monotonic() - started
    proc.communicate()
    return first


def runner_exit_to_outcome(workdir: Path) -> float:
    outcome = run_process(RunSpec(command=[sys.executable, "-c", EXIT_STAMP], cwd=workdir,
                                  log_path=workdir / "exit.log"))
    returned = time.monotonic()
    return returned - float(outcome.log_tail.split()[1])


def bare_exit_to_outcome(workdir: Path) -> float:
    proc = subprocess.Popen([sys.executable, "-c", EXIT_STAMP], cwd=workdir, stdout=subprocess.PIPE,
                            start_new_session=True)
    out, _ = proc.communicate()
    returned = time.monotonic()
    return returned - float(out.split()[1])


def sampling_cpu(workdir: Path, seconds: float, interval: float) -> float:
    cpu, wall = time.process_time(), time.monotonic()
    run_process(RunSpec(command=[sys.executable, "-c", f"import time; time.sleep({seconds})"], cwd=workdir,
                        log_path=workdir / "sleep.log", sample_interval_s=interval))
    return (time.process_time() - cpu) / (time.monotonic() - wall)


def bare_wait_cpu(workdir: Path, seconds: float) -> float:
    cpu, wall = time.process_time(), time.monotonic()
    subprocess.run([sys.executable, "-c", f"import time; time.sleep({seconds})"], cwd=workdir, check=True)
    return (time.process_time() - cpu) / (time.monotonic() - wall)


def ms(values: list[float]) -> str:
    low, mid, high = (1000 * x for x in (min(values), statistics.median(values), max(values)))
    return f"median {mid:6.1f} ms  (min {low:6.1f}, max {high:6.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    args = parser.parse_args()
    print(f"{psutil.cpu_count()} CPUs, {len(psutil.pids())} processes on the machine, python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for name, bare, ours in [("launch -> first byte", bare_first_byte, runner_first_byte),
                                 ("exit -> outcome     ", bare_exit_to_outcome, runner_exit_to_outcome)]:
            bare_times = [bare(workdir) for _ in range(args.repeat)]
            our_times = [ours(workdir) for _ in range(args.repeat)]
            print(f"{name}  bare subprocess: {ms(bare_times)}")
            print(f"{' ' * len(name)}  run_process:       {ms(our_times)}")
        print(f"sampling CPU, child sleeping {args.sample_seconds:g} s:")
        print(f"  bare subprocess.run:          {bare_wait_cpu(workdir, args.sample_seconds):.4f} CPU-s per wall-s")
        for interval in (0.25, 0.05):
            cpu = sampling_cpu(workdir, args.sample_seconds, interval)
            print(f"  run_process, sampling every {interval:g} s: {cpu:.4f} CPU-s per wall-s")


if __name__ == "__main__":
    main()
