"""Trials over N ranks: the launch command, through torch's own launcher.

``--gpus-per-trial N`` (N > 1) runs the trial's script as N processes under
``python -m torch.distributed.run --standalone --nproc-per-node N``: one machine, a
rendezvous of its own on a free port, no restarts (a failed rank ends the trial, the
launcher ends the others). The launcher is a child of the runner like any trial command,
so the runner's process-tree and cgroup containment end every rank with it.

Which devices the ranks see is the worker's environment (autoloop.execution.devices).
"""

from __future__ import annotations

from pathlib import PurePath

from autoloop.core.errors import ConfigError

LAUNCHER = ["-m", "torch.distributed.run", "--standalone"]
# The launcher checks its ranks this often (seconds): a rank that died ends the trial at once.
MONITOR_INTERVAL_S = 0.5


def _is_python(arg: str) -> bool:
    return PurePath(arg).name.startswith("python")


def launch_command(argv: list[str], ranks: int) -> list[str]:
    """The trial command for `ranks` processes: argv itself for one; else the launcher put in
    front of the first ``.py`` argument (``python train.py`` -> ``python -m torch.distributed.run
    ... train.py``; ``uv run train.py`` -> ``uv run python -m torch.distributed.run ... train.py``)."""
    if ranks <= 1:
        return list(argv)
    scripts = [i for i, arg in enumerate(argv) if arg.endswith(".py")]
    if not scripts:
        raise ConfigError(f"--gpus-per-trial {ranks} needs a command that runs a .py script "
                          f"(torch.distributed.run launches it), got {' '.join(argv)!r}")
    at = scripts[0]
    options = [*LAUNCHER, "--nproc-per-node", str(ranks), "--max-restarts", "0",
               "--monitor-interval", str(MONITOR_INTERVAL_S)]
    if _is_python(argv[0]):   # python [options] train.py
        return [*argv[:at], *options, *argv[at:]]
    return [*argv[:at], "python", *options, *argv[at:]]


def throughput(summary: dict[str, float], gpus_per_trial: int) -> dict[str, float | int | None]:
    """The ledger's throughput fields from train.py's summary block: the ranks it reports
    (else the ranks launched), tokens/s over all ranks, MFU (absent: an unknown peak)."""
    world = summary.get("world_size")
    return {"world_size": int(world) if world else max(1, gpus_per_trial),
            "tokens_per_s": summary.get("tokens_per_sec"), "mfu_percent": summary.get("mfu_percent")}
