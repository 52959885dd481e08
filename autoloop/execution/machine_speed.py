"""The machine's own speed beside each trial, measured without train.py (docs/machine-speed.md).

A wall-clock budget rewards a change that trains faster, so the steps a run managed cannot be
normalised away; what must come out of a decision is the *machine's* share: a fast minute on
a shared host, a slow one while a neighbour compiles. This measures it with a reference that
is the same on every run and never imports the trial's code:

* a fixed kernel just before and just after the trial: one pure-Python loop of a fixed
  length per CPU, all at once, in child processes (the rate is the sum of their rates, so a
  neighbour holding one core shows); on a CUDA device a fixed bf16 matmul loop instead;
* over training itself, from ``/proc/stat`` read once a second: the share of the machine's
  CPU time that went neither to the trial (its process tree's CPU time) nor to idle
  (``others``: the neighbours' load, the jitter that happens *during* training), and the
  hypervisor's ``steal`` (a VM's host taking cycles); see :class:`Probe` for the window.

``speed`` (what the ledger's ``machine_speed`` holds) is, on a CPU, the CPUs left to the trial
during training, ``(1 - others - steal) x CPUs``; on a GPU, the CUDA kernel's rate times that
share. Why the CPU kernel is recorded but not used: benchmarks/machine_noise.py on the loaded
2-core host found the kernel before and after a 60 s run moving by up to 2.5x and leaving 0.40
of the metric's spread against 0.23 for the share (it sees the load at two instants around
training, not during it); the share during training followed each run's steps within ~10 %.

A background sampler running the kernel *during* training was not used: on a CPU trial it
competes with train.py itself, so it would measure train.py's own threads, which differ from
commit to commit (a change that uses more threads would look like a slower machine).

``AUTOLOOP_PROBE_SCALE`` is for tests only (docs/machine-speed.md): comma-separated factors,
one per probed run in turn (the last repeats). The kernel and /proc/stat are still read and
recorded, but ``speed`` becomes the factor times :data:`NOMINAL` and the factor is passed to
the trial under the same name, so that a stand-in can train "slower" or "faster" by it. A
test turns the machine's speed like a knob and can fail reliably; what the loaded host's
real jitter does is benchmarks/machine_noise.py's question.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

SCALE_VAR = "AUTOLOOP_PROBE_SCALE"   # test-only: the machine speed of each probed run, as factors
CPU_LOOPS = 300_000                  # ~0.08 s of an idle core; fixed (recorded, not used on a CPU: see above)
CUDA_MATMULS = 200                   # 4096 x 4096 bf16: ~0.1 s on an H100-class GPU
PROBE_TIMEOUT_S = 60.0
SAMPLE_S = 1.0                       # /proc/stat and the trial's CPU read this often during the run
NOMINAL = 1e6                        # the speed a factor of 1 stands for (AUTOLOOP_PROBE_SCALE)

_scale_lock = threading.Lock()
_scale_runs = 0   # probed runs so far in this process: the index into AUTOLOOP_PROBE_SCALE

_CPU_KERNEL = f"""
import time
t = time.perf_counter()
x = 0
for i in range({CPU_LOOPS}):
    x = (x * 31 + i) & 0xFFFFFFFF
print({CPU_LOOPS} / (time.perf_counter() - t))
"""

_CUDA_KERNEL = f"""
import time, torch
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    a @ b
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range({CUDA_MATMULS}):
    a @ b
torch.cuda.synchronize()
print({CUDA_MATMULS} * 2 * 4096 ** 3 / (time.perf_counter() - t))
"""


@dataclass(frozen=True)
class CpuTimes:
    """One reading of /proc/stat's first line (seconds), and of this process's reaped children."""

    busy: float
    steal: float
    total: float
    children: float
    at: float


def cpu_count() -> int:
    """The host's CPUs as /proc/stat counts them (a container's affinity can be smaller)."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
        return max(1, sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit()))
    except OSError:
        return os.cpu_count() or 1


def read_times() -> CpuTimes | None:
    """Now's CPU times; None where /proc/stat is not there (macOS)."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) / hz for v in first[1:9])
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return CpuTimes(busy=user + nice + system + irq + softirq, steal=steal,
                    total=user + nice + system + idle + iowait + irq + softirq + steal,
                    children=usage.ru_utime + usage.ru_stime, at=time.monotonic())


def kernel_rate(device: str | None = None, env: dict[str, str] | None = None,
                short: bool = False) -> tuple[float | None, str]:
    """(rate, kernel) of the fixed kernel now; rate None when it could not run. ``short``:
    a tenth of the CPU loops (under the test knob, whose factor stands in for the rate)."""
    # device None: train.py picks one itself; a GPU is what it picks where nvidia-smi is.
    if (device or ("cuda" if shutil.which("nvidia-smi") else "cpu")).startswith("cuda"):
        rate = _run([_CUDA_KERNEL], env)
        if rate is not None:
            return rate, "cuda bf16 matmul"
    n = cpu_count()
    kernel = _CPU_KERNEL.replace(str(CPU_LOOPS), str(CPU_LOOPS // 10)) if short else _CPU_KERNEL
    rate = _run([kernel] * n, env)
    return rate, f"python loop x{n}"


def _run(kernels: list[str], env: dict[str, str] | None) -> float | None:
    """Start every kernel at once; the sum of their rates (None if any failed)."""
    full = {**os.environ, **(env or {})}
    procs = [subprocess.Popen([sys.executable, "-I", "-c", k], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=full, text=True) for k in kernels]
    total = 0.0
    try:
        for p in procs:
            out, _ = p.communicate(timeout=PROBE_TIMEOUT_S)
            total += float(out.strip())
    except (subprocess.TimeoutExpired, ValueError):
        for p in procs:
            p.kill()
            p.wait()
        return None
    return total


@dataclass(frozen=True)
class Sample:
    """/proc/stat and the trial's own CPU seconds (its live process tree) at one moment."""

    times: CpuTimes
    trial: float


class Probe:
    """The measurement around one trial: ``start()`` before it, ``watch(pids)`` when it has
    started, ``mark()`` at each of its progress lines, ``finish()`` after it.

    Between start and finish a thread reads /proc/stat and the trial's CPU seconds once a
    second (a file read; nothing that competes with the trial). The shares are taken over
    the training window, from the first to the last progress line, where the metric's steps
    are made (evaluation after it can take longer than training on a loaded host and does
    not move the metric); over the whole run when the trial printed fewer than two lines.
    """

    def __init__(self, device: str | None = None, env: dict[str, str] | None = None):
        self.device, self.env = device, env
        self.before: float | None = None
        self.kernel = ""
        self._factor: float | None = None
        self._pids: list[tuple[int, float]] = []
        self._samples: list[Sample] = []
        self._marks: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> dict[str, str]:
        """Measure before the run; the environment to add to the trial's (only under the test knob)."""
        self._factor = _next_factor()
        self.before, self.kernel = kernel_rate(self.device, self.env, short=self._factor is not None)
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="autoloop-machine-probe", daemon=True)
        self._thread.start()
        return {} if self._factor is None else {SCALE_VAR: repr(self._factor)}

    def watch(self, pids: list[tuple[int, float]]) -> None:
        """The trial's processes (the runner's on_start): whose CPU time is the trial's own."""
        self._pids = list(pids)

    def mark(self, _line: str = "") -> None:
        """A progress line of the trial: training is going on now."""
        self._marks.append(time.monotonic())

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def _sample(self) -> None:
        t = read_times()
        if t is not None:
            # A tree's CPU time only grows; read after the tree was ended (a pruned run's last
            # sample) it is 0, which made the neighbours' share 0.87 on an idle machine.
            last = self._samples[-1].trial if self._samples else 0.0
            self._samples.append(Sample(t, max(last, _tree_cpu(self._pids))))

    def finish(self) -> dict[str, float | str] | None:
        """The record's ``extra.machine``: the kernel's rate before and after, the shares of
        the machine the neighbours and the hypervisor took during training, and ``speed``;
        None when nothing could be measured."""
        self.close()
        self._sample()
        after, _ = kernel_rate(self.device, self.env, short=self._factor is not None)
        rates = [r for r in (self.before, after) if r is not None]
        if not rates:
            return None
        found: dict[str, float | str] = {"kernel": self.kernel}
        found |= {k: _r(v) for k, v in (("probe_before", self.before), ("probe_after", after)) if v is not None}
        shares = self._shares()
        if shares is not None:
            found |= shares
        found["speed"] = self._speed(sum(rates) / len(rates), shares)
        if self._factor is not None:
            found |= {"measured_speed": found["speed"], "speed": _r(self._factor * NOMINAL)}
        return found

    def speed_so_far(self) -> float | None:
        """``speed`` over the training window so far, for a decision during the run (the
        pruning rule); None before two progress lines and two samples inside them (the
        whole-run window counts the trial's CPU only once it is reaped)."""
        if self._factor is not None:
            return _r(self._factor * NOMINAL)
        shares = self._shares()
        if shares is None or shares["window"] != "training":
            return None
        if self.kernel.startswith("cuda") and self.before is None:
            return None
        return self._speed(self.before or 0.0, shares)

    def _speed(self, rate: float, shares: dict[str, float | str] | None) -> float:
        """``speed`` from the kernel's ``rate`` and the shares the others took (none: all left)."""
        share = 1.0 if shares is None else max(0.05, 1.0 - float(shares["others"]) - float(shares["steal"]))
        if self.kernel.startswith("cuda"):   # the GPU's rate, times the host's share left (its input pipeline)
            return _r(rate * share)
        return _r(share * cpu_count())   # the CPUs left to the trial; the kernel around it is recorded, not used

    def close(self) -> None:
        """End the sampling thread (finish does; call it alone when the run's figures are not wanted)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _shares(self) -> dict[str, float | str] | None:
        """others and steal over the training window (else the whole run), and which it was."""
        samples, window = self._samples, "run"
        if len(self._marks) >= 2 and self._marks[-1] - self._marks[0] >= 2 * SAMPLE_S:
            inside = [x for x in samples if self._marks[0] - SAMPLE_S <= x.times.at <= self._marks[-1] + SAMPLE_S]
            if len(inside) >= 2:
                samples, window = inside, "training"
        if len(samples) < 2 or samples[-1].times.total <= samples[0].times.total:
            return None
        a, b = samples[0], samples[-1]
        total = b.times.total - a.times.total
        # The trial's CPU: its live tree's, or, over the whole run, what this process reaped
        # (the trial is reaped by the end, its tree is gone).
        trial = b.trial - a.trial if window == "training" else b.times.children - a.times.children
        others = min(0.95, max(0.0, (b.times.busy - a.times.busy - trial) / total))
        steal = min(0.95, max(0.0, (b.times.steal - a.times.steal) / total))
        return {"others": round(others, 4), "steal": round(steal, 4), "window": window,
                "window_s": round(b.times.at - a.times.at, 1)}


def _tree_cpu(pids: list[tuple[int, float]]) -> float:
    """User + system seconds of the live processes ``pids`` and their descendants."""
    total = 0.0
    seen: set[int] = set()
    for pid, _created in pids:
        try:
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                if p.pid not in seen:
                    seen.add(p.pid)
                    t = p.cpu_times()
                    total += t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total


def _next_factor() -> float | None:
    """This run's factor under the test knob AUTOLOOP_PROBE_SCALE; None (always) without it."""
    global _scale_runs
    text = os.environ.get(SCALE_VAR)
    if not text:
        return None
    factors = [float(v) for v in text.split(",")]
    with _scale_lock:
        i, _scale_runs = _scale_runs, _scale_runs + 1
    return factors[min(i, len(factors) - 1)]


def _r(x: float) -> float:
    return float(f"{x:.5g}")
