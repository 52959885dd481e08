"""Which device each worker slot's trials get.

One slot (the single loop) passes the settings' device through and leaves the GPUs as they
are. N slots get one GPU each (``--devices``, or the first N visible), or, with fewer GPUs
than slots, all run on the CPU and share its cores: each trial gets cores // N threads,
since N trials each asking for every core would oversubscribe them and slow all of them.
With ``--gpus-per-trial G`` above 1 each slot gets a group of G GPUs (its ranks' devices),
or, with ``--device cpu``, G CPU ranks with cores // (N * G) threads each.

All that is for trials that run on this machine. An executor whose engine places the trial
(``places_devices``: Slurm) gets nothing from here (:func:`placed_envs`): the GPUs this host
sees say nothing of the node's, and a CUDA_VISIBLE_DEVICES shipped from here would override
the one Slurm bound on the node (the slot's variables go over the job's environment).
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Mapping

from autoloop.config.settings import Settings
from autoloop.core.errors import NightError
from autoloop.execution.ranks import launch_command


def slot_envs(settings: Settings, n: int) -> tuple[list[dict[str, str]], str | None]:
    """The environment each of n slots adds to its trials, and one line saying what was
    chosen (None for one slot: nothing is chosen, the settings apply as they are)."""
    if settings.gpus_per_trial > 1:
        return rank_group_envs(settings, n)
    if n == 1:
        return [{}], None
    return worker_envs(settings, n)


def placed_envs(settings: Settings, n: int, engine: str) -> tuple[list[dict[str, str]], str | None]:
    """The slots of an executor whose engine binds each trial's devices where it places it:
    no device variables (each trial sees what ``engine`` bound), and one line saying so."""
    g = settings.gpus_per_trial
    launch_command(settings.command_argv, g)   # a command the launcher cannot run: one line now
    if settings.devices:
        raise NightError(f"--devices picks GPUs of this machine; with --executor {engine} the trial's node has "
                         f"those {engine} binds to it: leave --devices out")
    if n == 1 and g <= 1:
        return [{}], None
    what = "CPU rank(s)" if settings.device == "cpu" else "GPU(s)"
    return [{} for _ in range(n)], (f"devices: {g} {what} per trial, {n} trial(s) at once, each on what "
                                    f"{engine} binds to its job on its node")


def visible_gpu_ids(count: int) -> list[str]:
    ids = (os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(map(str, range(count)))).split(",")
    return [i.strip() for i in ids if i.strip() and i.strip() != "-1"]


def rank_group_envs(settings: Settings, n: int, cuda_count: int | None = None) -> tuple[list[dict[str, str]], str]:
    """n slots of --gpus-per-trial G ranks each: G CPU ranks per slot with --device cpu, else
    G GPUs per slot (--devices, or the visible ones, in order); NightError when too few."""
    g = settings.gpus_per_trial
    launch_command(settings.command_argv, g)   # a command the launcher cannot run: one line now
    if settings.device == "cpu":
        cores = os.cpu_count() or 1
        threads = str(max(1, cores // (n * g)))
        env = {"AUTOLOOP_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": threads,
               "MKL_NUM_THREADS": threads}
        return [dict(env) for _ in range(n)], (f"devices: {g} CPU ranks per trial (gloo), {n} trial(s) at once, "
                                               f"{threads} thread(s) per rank")
    if settings.device is not None and settings.device != "cuda":
        raise NightError(f"--gpus-per-trial {g} runs on --device cuda or cpu, not {settings.device}")
    if settings.devices:
        ids = [str(d) for d in settings.devices]
    else:
        ids = visible_gpu_ids(cuda_device_count() if cuda_count is None else cuda_count)
    if n * g > len(ids):
        raise NightError(f"--workers {n} x --gpus-per-trial {g} needs {n * g} GPUs, {len(ids)} visible; "
                         f"pass fewer, or --device cpu for CPU ranks")
    groups = [",".join(ids[k * g:(k + 1) * g]) for k in range(n)]
    return ([{"CUDA_VISIBLE_DEVICES": group, "AUTOLOOP_DEVICE": "cuda"} for group in groups],
            f"devices: {g} GPUs per trial ({'; '.join(groups)})")


def cuda_device_count() -> int:
    """CUDA devices visible to us without importing torch (seconds of start-up): the
    CUDA_VISIBLE_DEVICES list when set, else `nvidia-smi -L`; 0 when neither says."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) if out.returncode == 0 else 0


def worker_envs(settings: Settings, n: int, cuda_count: int | None = None) -> tuple[list[dict[str, str]], str]:
    """The environment each worker's trials get, and one line saying what was chosen.

    --devices: one CUDA device each. Else one GPU each when there are at least n, else all
    on the CPU, where each trial gets cores // n threads: n trials asking for every core
    each would oversubscribe them and slow all of them down.
    """
    if settings.devices:
        envs = [{"CUDA_VISIBLE_DEVICES": str(d), "AUTOLOOP_DEVICE": "cuda"} for d in settings.devices[:n]]
        return envs, f"devices: worker k on CUDA device {', '.join(map(str, settings.devices[:n]))} (in order)"
    device = settings.device
    if device is None or device.startswith("cuda"):
        count = cuda_device_count() if cuda_count is None else cuda_count
        if count >= n:
            ids = (os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(map(str, range(count)))).split(",")
            ids = [i.strip() for i in ids if i.strip()][:n]
            return ([{"CUDA_VISIBLE_DEVICES": i, "AUTOLOOP_DEVICE": "cuda"} for i in ids],
                    f"devices: one GPU per worker ({', '.join(ids)})")
        if device is not None:
            raise NightError(f"--workers {n} with --device {device} needs {n} CUDA devices, {count} visible; "
                            f"pass --devices or fewer --workers")
        gpus = f" ({count} GPU(s) visible: fewer than the workers; --devices assigns them)" if count else ""
    else:
        gpus = ""
    cores = os.cpu_count() or 1
    threads = str(max(1, cores // n))
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    if device in (None, "cpu") or device.startswith("cuda"):
        env.update(AUTOLOOP_DEVICE="cpu", CUDA_VISIBLE_DEVICES="")
    return [dict(env) for _ in range(n)], (f"devices: {n} workers share {cores} CPU cores, "
                                           f"{threads} thread(s) per trial{gpus}")


def trial_device_kind(settings: Settings, env: Mapping[str, str] | None = None) -> str:
    """cpu, cuda or mps: the kind of device a slot's trials train on, as train.py picks it
    (the slot's AUTOLOOP_DEVICE, else --device, else a GPU when one is visible)."""
    wanted = (env or {}).get("AUTOLOOP_DEVICE") or settings.device
    if wanted:
        return wanted.split(":")[0]
    return "cuda" if _cuda_visible() else "cpu"


@functools.lru_cache(maxsize=1)
def _cuda_visible() -> bool:
    """Asked once per process: nvidia-smi takes a while, and the GPUs do not come and go in a night."""
    return cuda_device_count() > 0
