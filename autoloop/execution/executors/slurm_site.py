"""What a site's trial job needs beyond its GPUs: CPUs and memory that grow with them, the
setup lines (``module load``, a venv), a container, and any other sbatch option passed through.

CPUs and memory default to a GPU's share of the partition's node (``sinfo``: its CPUs and
memory over its GPUs, the smallest such node): eight ranks on one default CPU starve the data
loaders and Inductor's compile workers. The CPUs are asked per task (one task per node runs
the trial's launcher and all its ranks); srun gets them too, since Slurm 22.05's srun no longer
inherits ``--cpus-per-task`` from the job (``SRUN_CPUS_PER_TASK``, set in the batch script).
``slurm_exclusive`` asks for whole nodes instead (``--exclusive``, ``--mem=0``).

The container runs submitit's job function inside the image: ``pyxis:IMAGE`` through srun's
``--container-image`` (NVIDIA's pyxis plugin), ``apptainer:IMAGE`` as ``apptainer exec --nv``.
The image must hold Python with autoloop and submitit (``pip install 'autoloop[slurm]'``); the
work tree is mounted at its own path, so results/ and the job files are where the loop reads them.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoloop.execution.executors import ExecutorError
from autoloop.execution.executors.slurm_gpus import gres_gpus

# An sbatch long option as submitit names it (underscores for dashes): a pass-through key.
_OPTION_RE = re.compile(r"^[a-z][a-z0-9_-]*$")
# Set by our own settings; in slurm_options they would silently fight those.
OWN_OPTIONS = {"partition": "slurm_partition", "time": "slurm_time_limit",
               "gpus_per_node": "gpus_per_trial", "gpus": "gpus_per_trial", "gpus_per_task": "gpus_per_trial",
               "num_gpus": "gpus_per_trial", "nodes": "nodes_per_trial", "ntasks_per_node": "nodes_per_trial",
               "setup": "slurm_setup (a list of lines)", "exclusive": "slurm_exclusive",
               "cpus_per_gpu": "slurm_cpus_per_gpu", "job_name": "autoloop (autoloop-<tag>-<trial>.<attempt>)"}
_MEMORY_KEYS = ("mem", "mem_per_cpu", "mem_per_gpu")
# srun in a batch script takes its CPUs per task from this variable (Slurm 22.05+ does not
# pass the job's --cpus-per-task on); an exclusive job has all of its node's.
SRUN_CPUS = "export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-$SLURM_CPUS_ON_NODE}"


@dataclass
class SiteJob:
    """submitit parameters, the python that runs the job function, and what was chosen (one line)."""

    parameters: dict[str, Any] = field(default_factory=dict)
    python: str | None = None
    said: list[str] = field(default_factory=list)


def node_shares(partition: str | None) -> tuple[int, int] | None:
    """A GPU's share of the partition's nodes: (CPUs, memory MB) per GPU on the node with the
    smallest share; None where sinfo cannot tell or no node has a GPU."""
    if shutil.which("sinfo") is None:
        return None
    argv = ["sinfo", "-h", "-N", "-o", "%P|%c|%m|%G"] + (["-p", partition] if partition else [])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_shares(proc.stdout, partition) if proc.returncode == 0 else None


def parse_shares(text: str, partition: str | None) -> tuple[int, int] | None:
    """``sinfo -N -o %P|%c|%m|%G`` lines -> (CPUs, MB) per GPU, the smallest over the GPU nodes."""
    shares: list[tuple[int, int]] = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4 or (not partition and not parts[0].endswith("*")):
            continue
        gpus = gres_gpus(parts[3])
        cpus, mem = (int(re.sub(r"\D", "", v) or 0) for v in parts[1:3])
        if gpus and cpus:
            shares.append((max(1, cpus // gpus), mem // gpus))
    return min(shares) if shares else None


def site_job(settings: Any, gpus: int, root: Path, cluster: str) -> SiteJob:
    """The site's part of a trial's job (see the module's docstring); ExecutorError, one line,
    for a setting that cannot work."""
    job = SiteJob()
    options = passed_through(settings.slurm_options)
    setup = list(settings.slurm_setup)
    if settings.slurm_exclusive:
        job.parameters.update(exclusive=True, mem="0")
        job.said.append("whole nodes (--exclusive)")
    elif gpus:
        shares = node_shares(settings.slurm_partition) if cluster == "slurm" else None
        cpus = settings.slurm_cpus_per_gpu or (shares[0] if shares else None)
        if cpus and "cpus_per_task" not in options:
            job.parameters["cpus_per_task"] = cpus * gpus
            job.said.append(f"{cpus * gpus} CPUs")
        if not any(k in options for k in _MEMORY_KEYS):
            mem = settings.slurm_mem_per_gpu or (f"{shares[1]}M" if shares and shares[1] else None)
            if mem:
                job.parameters["mem_per_gpu"] = mem
                job.said.append(f"{mem} per GPU")
    if cluster == "slurm":
        setup.insert(0, SRUN_CPUS)
    if settings.slurm_container:
        runtime, _, image = settings.slurm_container.partition(":")
        mount = str(Path(root).absolute())
        if runtime == "pyxis":
            job.parameters["srun_args"] = ["--container-image", image, "--container-mounts", f"{mount}:{mount}",
                                           "--container-workdir", mount]
            job.python = "python3"
        else:
            job.python = f"apptainer exec --nv --bind {shlex.quote(mount)} {shlex.quote(image)} python3"
        job.said.append(f"in container {settings.slurm_container}")
    job.parameters["setup"] = setup
    extra = {k: v for k, v in options.items() if k not in _SUBMITIT_KEYS}
    job.parameters.update({k: v for k, v in options.items() if k in _SUBMITIT_KEYS})
    if extra:
        job.parameters["additional_parameters"] = extra
    return job


def passed_through(options: dict[str, Any]) -> dict[str, Any]:
    """slurm_options keyed as submitit names them (``-`` to ``_``); ExecutorError for a key our
    own settings set or one that cannot be an sbatch option. Any other key goes to sbatch as
    ``--key=value`` (``true``: ``--key`` alone; ``false``: left out)."""
    found: dict[str, Any] = {}
    for raw, value in options.items():
        key = str(raw).strip().replace("-", "_")
        if key in OWN_OPTIONS:
            raise ExecutorError(f"slurm_options: {raw!r} is set by {OWN_OPTIONS[key]}; use that setting")
        if not _OPTION_RE.match(key):
            raise ExecutorError(f"slurm_options: {raw!r} is not an sbatch option name (letters, digits, - and _)")
        if value is False:
            continue
        found[key] = value
    return found


def _submitit_keys() -> frozenset[str]:
    try:
        import submitit
    except ImportError:
        return frozenset()
    return frozenset(submitit.SlurmExecutor._valid_parameters())


_SUBMITIT_KEYS = _submitit_keys()
