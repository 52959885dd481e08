"""Trials over N ranks: the launch command, through torch's own launcher.

``--gpus-per-trial N`` (N > 1) runs the trial's script as N processes under
``python -m torch.distributed.run --standalone --nproc-per-node N``: one machine, a
rendezvous of its own on a free port, no restarts (a failed rank ends the trial, the
launcher ends the others). The launcher is a child of the runner like any trial command,
so the runner's process-tree and cgroup containment end every rank with it.

Which devices the ranks see is the worker's environment (autoloop.execution.devices).
"""

from __future__ import annotations

import math
from pathlib import Path, PurePath
from typing import Any, TypedDict

from autoloop.core.errors import ConfigError
from autoloop.execution.procs import TOKEN_VAR
from autoloop.execution.runner import RunSpec

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
    return _launched(argv, [*LAUNCHER, "--nproc-per-node", str(ranks), *_NO_RESTARTS], ranks)


def node_command(argv: list[str], nodes: int, node_rank: int, address: str, port: int) -> list[str]:
    """Node ``node_rank``'s share of a trial spread over ``nodes`` nodes: the trial command (as
    :func:`launch_command` made it, launcher or not) with the launcher meeting the other
    nodes' at ``address:port``, the first node, instead of a rendezvous of its own.

    A static rendezvous (the node's rank given) rather than c10d's: c10d numbers the nodes in
    the order they join, so rank 0, the one that evaluates and writes the result, landed on
    the second node in one of two runs, whose log is not the trial's."""
    plain, ranks = _without_launcher(argv)
    options = ["-m", "torch.distributed.run", "--nnodes", str(nodes), "--node-rank", str(node_rank),
               "--nproc-per-node", str(ranks), "--master-addr", address, "--master-port", str(port), *_NO_RESTARTS]
    return _launched(plain, options, ranks)


def node_share(spec: RunSpec, nodes: int, rank: int, address: str, port: int) -> RunSpec:
    """Node ``rank``'s share of a trial spread over ``nodes`` nodes (a Slurm task per node, a Ray
    actor per node): its launcher meets the others' at ``address:port`` (:func:`node_command`).
    The first node's share is the trial (its log, its result file, its process token); the
    others' logs and result files get a ``.node<k>`` name of their own, since the runner starts
    each run by removing the result file it will read."""
    update: dict[str, Any] = {"command": node_command(spec.command, nodes, rank, address, port)}
    if rank:
        # A token of its own: the runner ends every process carrying its token, and its cgroup
        # is named by it, so two nodes on one host (the test clusters) would end each other's.
        token = spec.env.get(TOKEN_VAR)
        if token:
            update["env"] = {**spec.env, TOKEN_VAR: node_token(token, rank)}
        log = Path(spec.log_path)
        update["log_path"] = log.with_name(f"{log.stem}.node{rank}{log.suffix}")
        if spec.result_path is not None:
            result = Path(spec.result_path)
            update["result_path"] = result.with_name(f"{result.stem}.node{rank}{result.suffix}")
    return spec.model_copy(update=update)


def node_token(token: str, rank: int) -> str:
    """The process token of node ``rank``'s share of a trial whose token is ``token``."""
    return f"{token}n{rank}" if rank else token


# A failed rank ends the trial (no restarts); the launcher looks at its ranks this often.
_NO_RESTARTS = ["--max-restarts", "0", "--monitor-interval", str(MONITOR_INTERVAL_S)]


def _launched(argv: list[str], options: list[str], ranks: int) -> list[str]:
    scripts = [i for i, arg in enumerate(argv) if arg.endswith(".py")]
    if not scripts:
        raise ConfigError(f"--gpus-per-trial {ranks} needs a command that runs a .py script "
                          f"(torch.distributed.run launches it), got {' '.join(argv)!r}")
    at = scripts[0]
    if any(_is_python(arg) for arg in argv[:at]):   # [uv run] python [options] train.py
        return [*argv[:at], *options, *argv[at:]]
    return [*argv[:at], "python", *options, *argv[at:]]


def _without_launcher(argv: list[str]) -> tuple[list[str], int]:
    """The command as it was before :func:`launch_command` put the launcher in, and its ranks."""
    if "torch.distributed.run" not in argv:
        return list(argv), 1
    start = argv.index("torch.distributed.run") - 1          # "-m"
    script = next(i for i in range(start, len(argv)) if argv[i].endswith(".py"))
    options = argv[start:script]
    ranks = int(options[options.index("--nproc-per-node") + 1]) if "--nproc-per-node" in options else 1
    before = argv[:start]
    if before and before[-1] == "python" and not any(_is_python(arg) for arg in before[:-1]):
        before = before[:-1]   # put there by _launched
    return [*before, *argv[script:]], ranks


class Throughput(TypedDict):
    """The ledger record's throughput fields (LedgerRecord.world_size, tokens_per_s, mfu_percent)."""

    world_size: int
    tokens_per_s: float | None
    mfu_percent: float | None


def throughput(summary: dict[str, float], gpus_per_trial: int) -> Throughput:
    """The ledger's throughput fields from train.py's summary block: the ranks it reports
    (else the ranks launched), tokens/s over all ranks, MFU (absent: an unknown peak)."""
    world = summary.get("world_size")
    mfu = summary.get("mfu_percent")   # nan where train.py knows no peak for the device
    return {"world_size": int(world) if world else max(1, gpus_per_trial),
            "tokens_per_s": summary.get("tokens_per_sec"),
            "mfu_percent": mfu if mfu is not None and math.isfinite(mfu) else None}
