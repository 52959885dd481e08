"""How many GPUs (and nodes) a trial's job asks for, and the sbatch options that say so.

``slurm_gpus_per_trial`` unset (the default) asks for one GPU per trial only where the
partition has GPUs, as ``sinfo``'s GRES column says (``gpu:a100:4(S:0-1)``); a partition
without any gets none, instead of sbatch refusing every job with ``Invalid generic resource
(gres) specification``. What was asked and why is said once at start (:func:`gpu_plan`).

N GPUs per trial on M nodes (``nodes_per_trial``) map to ``--nodes=M --gpus-per-node=N
--ntasks-per-node=1``: one task per node, each running the trial's command, which for N > 1
already starts torch's launcher with ``--nproc-per-node N``; with M > 1 each node's launcher
meets the others' at the first node of the allocation instead (:func:`this_node`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

from autoloop.execution.executors import ExecutorError
from autoloop.execution.ranks import node_share
from autoloop.execution.runner import RunSpec

# Rendezvous ports are this plus the job id modulo 10000: clear of torchrun's default 29500,
# which a user's own torchrun may hold, and below the usual ephemeral range (32768+).
RENDEZVOUS_BASE_PORT = 20000
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
    if asked is not None and settings.device == "cpu":
        return 0, f"slurm: no GPU asked for: --device cpu runs the trial's {asked} rank(s) per node on its CPUs"
    has = partition_gpus(settings.slurm_partition) if cluster == "slurm" else 0
    if asked is not None and cluster == "slurm" and has is not None and asked > has:
        # Checked against the partition's nodes, not this host: a login node has no GPUs.
        offer = f"up to {has} per node" if has else "none"
        raise ExecutorError(f"--gpus-per-trial {asked}: {where} has {offer} (sinfo GRES); pass fewer, "
                            f"or --slurm-partition a partition with more")
    if asked is not None:
        return asked, f"slurm: {asked} GPU(s) per trial job (--gpus-per-trial)"
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


def rendezvous_port(job_id: str) -> int:
    """The port the job's rendezvous listens on, the same on every node without a word between
    them; two multi-node trials whose first node is one host (``--workers 2``) get two."""
    digits = re.sub(r"\D", "", job_id) or "0"
    return RENDEZVOUS_BASE_PORT + int(digits) % 10000


def this_node(spec: RunSpec, nodes: int, environ: Mapping[str, str]) -> RunSpec:
    """This node's share of a trial whose job spans ``nodes`` nodes (one task per node): the
    launcher meets the others' at the allocation's first node (``SLURM_JOB_NODELIST``); the
    first node's share is the trial, the others' logs and result files are named apart
    (ranks.node_share)."""
    rank = int(environ.get("SLURM_NODEID", "0"))
    job_id = environ.get("SLURM_JOB_ID", "0")
    address = node_address(first_node(environ.get("SLURM_JOB_NODELIST", "")))
    return node_share(spec, nodes, rank, address, rendezvous_port(job_id))


def node_address(node: str) -> str:
    """Where a node is reached (scontrol's NodeAddr: a node's name need not resolve), else its name."""
    out = _scontrol("show", "node", "-o", node)
    m = re.search(r"\bNodeAddr=(\S+)", out or "")
    return m.group(1) if m else node


def _scontrol(*argv: str) -> str | None:
    if shutil.which("scontrol") is None:
        return None
    try:
        return subprocess.run(["scontrol", *argv], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def first_node(nodelist: str) -> str:
    """The first host of a Slurm node list: ``scontrol show hostnames`` where it runs, else parsed."""
    out = (_scontrol("show", "hostnames", nodelist) or "").split()
    if out:
        return out[0]
    m = re.match(r"([^\[,]+)(?:\[(\d+))?", nodelist)
    if not m:
        return nodelist
    return m.group(1) + (m.group(2) or "")
