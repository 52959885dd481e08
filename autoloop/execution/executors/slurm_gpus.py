"""How many GPUs (and nodes) a trial's job asks for, and the sbatch options that say so.

``slurm_gpus_per_trial`` unset (the default) asks for one GPU per trial only where the
partition has GPUs, as ``sinfo``'s GRES column says (``gpu:a100:4(S:0-1)``); a partition
without any gets none, instead of sbatch refusing every job with ``Invalid generic resource
(gres) specification``. What was asked and why is said once at start (:func:`gpu_plan`).

N GPUs per trial on M nodes (``nodes_per_trial``) map to ``--nodes=M --gpus-per-node=N
--ntasks-per-node=1``: one task per node, which starts torch's launcher (torchrun) with
``--nproc-per-node N``; with M > 1 the ranks meet at the first node of the allocation
(:func:`rendezvous_env`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

RENDEZVOUS_PORT = 29500   # torchrun's default
_GPU_RE = re.compile(r"\bgpu(?::[^:,()\s]+)*?:(\d+)")


def gpus_asked(settings: Any) -> int | None:
    """GPUs per trial as the user set them (None: not set, decide from the partition)."""
    asked: int | None = settings.slurm_gpus_per_trial
    return asked


def gres_gpus(gres: str) -> int:
    """GPUs per node in one sinfo GRES field: ``gpu:a100:4(S:0-1),nvme:1`` -> 4; ``(null)`` -> 0."""
    return max((int(n) for n in _GPU_RE.findall(gres)), default=0)


def partition_gpus(partition: str | None) -> int | None:
    """The most GPUs any node of the partition (default: the default one) has; None if sinfo
    cannot tell."""
    if shutil.which("sinfo") is None:
        return None
    argv = ["sinfo", "-h", "-o", "%P|%G"] + (["-p", partition] if partition else [])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    best: int | None = None
    for line in proc.stdout.splitlines():
        name, _, gres = line.partition("|")
        if not partition and not name.endswith("*"):   # sinfo marks the default partition with *
            continue
        best = max(best or 0, gres_gpus(gres))
    return best


def gpu_plan(settings: Any, cluster: str) -> tuple[int, str]:
    """(GPUs per node to ask, one line saying why)."""
    asked = gpus_asked(settings)
    where = f"partition {settings.slurm_partition}" if settings.slurm_partition else "the default partition"
    if asked is not None:
        return asked, f"slurm: {asked} GPU(s) per trial job (slurm_gpus_per_trial)"
    has = partition_gpus(settings.slurm_partition) if cluster == "slurm" else 0
    if has is None:
        return 1, f"slurm: 1 GPU per trial job (sinfo did not say whether {where} has GPUs)"
    if has == 0:
        return 0, f"slurm: no GPU asked for: {where} has none (sinfo GRES); set slurm_gpus_per_trial to ask"
    return 1, f"slurm: 1 GPU per trial job ({where} has up to {has} per node; slurm_gpus_per_trial for more)"


def multi_parameters(gpus: int, nodes: int) -> dict[str, int]:
    """submitit SlurmExecutor parameters for a trial on ``nodes`` nodes with ``gpus`` GPUs each."""
    params: dict[str, int] = {"nodes": nodes, "ntasks_per_node": 1}
    if gpus:
        params["gpus_per_node"] = gpus
    return params


def rendezvous_env(nodelist: str, nodes: int, gpus: int, job_id: str) -> dict[str, str]:
    """Environment for torchrun on each node of a multi-node trial: rendezvous at the first node.

    ``nodelist`` is SLURM_JOB_NODELIST (``gpu[01-04]``), expanded by ``scontrol show hostnames``.
    """
    first = first_node(nodelist)
    return {"MASTER_ADDR": first, "MASTER_PORT": str(RENDEZVOUS_PORT), "AUTOLOOP_NNODES": str(nodes),
            "AUTOLOOP_NPROC_PER_NODE": str(max(1, gpus)), "AUTOLOOP_RDZV_ID": f"autoloop-{job_id}",
            "AUTOLOOP_RDZV_ENDPOINT": f"{first}:{RENDEZVOUS_PORT}"}


def torchrun_prefix(nodes: int, gpus: int, rdzv: dict[str, str]) -> list[str]:
    """The launcher in front of train.py: one torchrun per node, ``gpus`` processes each."""
    return ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={max(1, gpus)}", "--rdzv-backend=c10d",
            f"--rdzv-id={rdzv['AUTOLOOP_RDZV_ID']}", f"--rdzv-endpoint={rdzv['AUTOLOOP_RDZV_ENDPOINT']}"]


def first_node(nodelist: str) -> str:
    """The first host of a Slurm node list: ``scontrol show hostnames`` where it runs, else parsed."""
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                                 timeout=20).stdout.split()
            if out:
                return out[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
    m = re.match(r"([^\[,]+)(?:\[(\d+))?", nodelist)
    if not m:
        return nodelist
    return m.group(1) + (m.group(2) or "")
