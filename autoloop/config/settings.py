"""Settings: every setting declared once, a field of the pydantic model :class:`Settings`
made with :func:`setting` (default, checks, help, section, flag).

The flags (``cli/flags.py``) and docs/configuration.md (``reference.py``) are generated
from these fields; reading them from a config file and the command line, and saying a bad
value in one line, is ``loading.py``.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
import typing
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from autoloop.config.presets import PRESETS
from autoloop.core.durations import DURATION_HINT, default_timeout, format_duration, parse_duration
from autoloop.core.durations import show as _show
from autoloop.core.errors import ConfigError
from autoloop.core.guards import parse_guard
from autoloop.core.layout import DEFAULT_QUEUE_DIR, DEFAULT_SLURM_DIR, branch_name

__all__ = ["ConfigError", "DURATION_HINT", "Settings", "format_duration", "parse_duration"]


# ---------------------------------------------------------------------------------------------
# the settings model

_METRIC = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TAG = re.compile(r"^[A-Za-z0-9._-]+$")
_DEVICE = re.compile(r"^(cpu|cuda|cuda:\d+|mps)$")
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]


def date_tag(now: float | None = None) -> str:
    """Today's tag, e.g. 'nov29' (month names fixed, not locale-dependent)."""
    t = time.localtime(now)
    return f"{_MONTHS[t.tm_mon - 1]}{t.tm_mday}"


# The proposers a portfolio can share a night among (proposers/portfolio.py).
PORTFOLIO_MEMBERS = ("agent", "optuna", "mutate", "queue", "combine")
# A smaller log cap would keep less of the output's end than the runner reads to classify a crash.
MIN_LOG_CAP_MB = 0.125


# The sections of `autoloop run --help`, in order: key -> title.
SECTIONS = {
    "night": "the night (branch, when to stop)",
    "trial": "one trial (what runs, for how long, on what data)",
    "noise": "noise and the keep rule",
    "proposer": "proposer and agent",
    "safety": "safety (memory, logs, disk, network)",
    "workers": "parallel workers",
    "slurm": "where trials run (slurm, ray)",
    "watch": "watching the night (trackers, notifications, hooks)",
    "verify": "verification (autoloop verify, run --verify-at-end)",
}


_NOTED: set[str] = set()


def _deprecated(note: str) -> None:
    """One line on stderr, once per process: a deprecated setting still works."""
    if note not in _NOTED:
        _NOTED.add(note)
        print(f"autoloop: {note}", file=sys.stderr)


def agent_presets() -> list[str]:
    """The known coding agents (config/presets.py: their commands, flags and environment)."""
    return list(PRESETS)


def setting(default: Any, section: str, help: str, *, metavar: str | None = None, run_only: bool = False,
            default_text: str | None = None, choices: Any = None, flag: str | None = None,
            repeatable: bool = False, **checks: Any) -> Any:
    """One setting's field: its default and checks (pydantic), and what its flag needs.

    ``help`` is the --help text; the default is added to it (``{default}`` places it, else
    it goes at the end), written as the user would type it, or as ``default_text`` says.
    ``run_only``: a flag of `autoloop run`, not of `autoloop trial`. ``choices``: a callable
    giving the values the flag accepts (the Literal's values are used when it is one).
    ``flag``: the flag's name when it is not --<name-with-dashes>. ``repeatable``: a list
    setting whose flag may be given several times (each value is appended; the field's
    validator splits and checks them).
    """
    if section not in SECTIONS:
        raise ValueError(f"unknown settings section {section!r}")
    extra = {"section": section, "metavar": metavar, "run_only": run_only, "default_text": default_text,
             "choices": choices, "flag": flag, "repeatable": repeatable}
    if isinstance(default, (dict, list)):
        return Field(default_factory=type(default), description=help, json_schema_extra=extra, **checks)
    return Field(default=default, description=help, json_schema_extra=extra, **checks)


class Settings(BaseModel):
    """Every autoloop setting. Field names are the TOML keys and, with '-', the CLI flags."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # Each field is one setting: its TOML key, its flag (--max-trials), its --help text and
    # section, its default and its checks. autoloop.cli.flags builds the CLI from these.

    # -- the night ------------------------------------------------------------------------------
    tag: str | None = setting(
        None, "night", "work on branch autoloop/TAG", metavar="TAG", default_text="today, e.g. nov29")
    resume: bool = setting(
        False, "night", "continue the existing branch, recovering an interrupted trial first", run_only=True)
    rerun_interrupted: bool = setting(
        True, "night", "with --resume, run again (once) an attempt a kill of the orchestrator interrupted while it "
        "trained or was judged, as a new attempt of its trial; the interrupted record stays", run_only=True)
    from_tag: str | None = setting(
        None, "night", "start this night on the final branch of the earlier night TAG (autoloop/TAG): its kept "
        "changes are the new baseline", metavar="TAG", run_only=True, flag="--from")
    warm_start: bool = setting(
        True, "night", "seed the mutator's and Optuna's memory from earlier comparable nights of this workspace "
        "(their points and values, re-based when the best moved); --no-warm-start starts the search cold",
        run_only=True)
    hours: float | None = setting(
        None, "night", "start no trial that could not finish within H hours", metavar="H", run_only=True, gt=0)
    max_trials: int | None = setting(
        None, "night", "stop after N trials in this run; a failed proposal (a skip) counts as one", metavar="N",
        run_only=True, ge=1)
    verify_at_end: bool = setting(
        False, "night", "when the trials stop, run autoloop verify (settings: the verification section); with "
        "--hours, no trial starts that would eat the time the verification needs", run_only=True)

    # -- one trial ------------------------------------------------------------------------------
    budget: float = setting(
        300.0, "trial", "training time per trial: 300, 300s, 5m, 1h30m", metavar="DURATION")
    timeout: float | None = setting(
        None, "trial", "hard limit per trial, start-up and evaluation included", metavar="DURATION",
        default_text="max(2 x budget, budget + 2m)")
    scout: float | None = setting(
        None, "trial", "train each proposal this long first; only one within the scout noise of the best's scout "
        "result gets the full budget; about a tenth of the budget pays (docs/fidelity.md; off by default)",
        metavar="DURATION")
    prune: bool = setting(
        False, "trial", "stop a trial whose train loss falls behind the best's curve beyond its noise band past "
        "a warm-up share of the budget; recorded as pruned, never kept; turns itself off when the night's "
        "completed trials show the early loss does not rank as the end does (docs/fidelity.md; off by default)")
    target: str = setting("train.py", "trial", "the one file a proposer may edit", metavar="FILE")
    command: str | None = setting(
        None, "trial", "trial command, e.g. 'uv run train.py'", metavar="CMD",
        default_text="this Python on the target")
    metric: str = setting("val_bpb", "trial", "metric name the trial prints as 'NAME: value'", metavar="NAME")
    direction: Literal["min", "max"] = setting("min", "trial", "whether lower or higher is better")
    seed: int = setting(42, "trial", "seed handed to every trial", metavar="N")
    corpus: str = setting("stdlib", "trial", "'stdlib', 'climbmix' (public, GPU-sized: autoloop prepare "
                          "fetches it) or a directory, file or glob of text", metavar="SOURCE")
    data_dir: str | None = setting(None, "trial", "prepared data folder", metavar="DIR", default_text="per-user cache")
    device: str | None = setting(
        None, "trial", "cpu, cuda, cuda:N or mps", metavar="DEV", default_text="auto-detect")

    # -- what counts as a win besides the metric (docs/guards.md) --------------------------------
    guards: list[str] = setting(
        [], "trial", "a condition a keep must also meet, on a NAME: value line the trial prints, absolute or "
        "relative to the baseline: 'peak_vram_mb <= 1.10 * baseline', 'num_params_M <= 120' (repeat the flag)",
        metavar="EXPR", flag="--guard", repeatable=True)
    checks: list[str] = setting(
        [], "trial", "a command run in the candidate's tree before training (a unit test, a lint); a failing "
        "one costs no training: a trivial crash sent back for a fix (repeat the flag)", metavar="CMD",
        flag="--check", repeatable=True)

    @field_validator("guards", mode="before")
    @classmethod
    def _guards(cls, v: Any) -> Any:
        items = [v] if isinstance(v, str) else v
        if isinstance(items, list):
            for item in items:
                if not isinstance(item, str):
                    raise ValueError(f"must be guard expressions (strings), got {_show(item)}")
                parse_guard(item)   # a malformed guard is refused here, before anything runs
            return list(items)
        return v

    @field_validator("checks", mode="before")
    @classmethod
    def _checks(cls, v: Any) -> Any:
        items = [v] if isinstance(v, str) else v
        if isinstance(items, list):
            for item in items:
                if not isinstance(item, str):
                    raise ValueError(f"must be commands (strings), got {_show(item)}")
                try:
                    argv = shlex.split(item)
                except ValueError as e:
                    raise ValueError(f"cannot split {item!r} into arguments ({e})") from None
                if not argv:
                    raise ValueError("a check must not be empty")
            return list(items)
        return v

    # -- noise and the keep rule (docs/noise.md) -----------------------------------------------
    min_delta: float = setting(0.0, "noise", "a keep must beat the best by more than X", metavar="X", ge=0)
    noise_runs: int = setting(
        2, "noise", "extra runs of the baseline with seeds seed+1.. to estimate the noise (default {default}; 0: off)",
        metavar="N", ge=0)
    keep_rule: Literal["auto", "noise", "strict"] = setting(
        "auto", "noise", "noise: keep only beyond max(min-delta, z x noise), confirm borderline gains with re-runs "
        "(how many: from --power); strict: keep any gain > min-delta (default {default}: noise once an estimate "
        "exists)")
    noise_z: float = setting(2.0, "noise", "z of the noise rule", metavar="Z", gt=0)
    remeasure: bool = setting(
        False, "noise", "re-run the best commit --noise-runs times first and re-estimate the noise", run_only=True)
    machine_probe: bool = setting(
        True, "noise", "measure the machine's speed beside each local trial and decide on the metric adjusted to "
        "the night's median speed where that shrinks the spread of repeated runs (docs/machine-speed.md)")
    # A single-run gain over sanity_bound x |best| is re-run before it can be kept (docs/safety.md).
    sanity_bound: float = setting(
        0.1, "noise", "re-run a trial whose gain exceeds X x |best| before keeping it, and keep it only if the "
        "re-run beats the best too (default {default}, i.e. 10%; 0: off)", metavar="X", ge=0, allow_inf_nan=False)

    # -- the proposer and the agent (docs/proposers.md) ----------------------------------------
    proposer: Literal["auto", "queue", "mutate", "agent", "optuna", "portfolio", "combine"] = setting(
        "auto", "proposer", "where changes come from (default {default}: the portfolio when --portfolio is given, "
        "else the agent when one is configured, else the queue when patches are waiting, else mutate); optuna: "
        "Bayesian or evolutionary search over the target's constants, several per trial (needs pip install "
        "'autoloop[hpo]'); portfolio: a bandit shares the night among proposers; combine: changes that lost "
        "within the noise, tried together", run_only=True)
    queue_dir: str = setting(
        DEFAULT_QUEUE_DIR, "proposer", "folder of *.patch / *.py changes for the queue proposer", metavar="DIR",
        run_only=True)
    agent: str | None = setting(
        None, "proposer", "coding agent preset: Claude Code, Codex CLI, Aider or Gemini CLI (commands in "
        "docs/proposers.md)", choices=agent_presets, run_only=True)
    agent_cmd: str | None = setting(
        None, "proposer", "any other agent command, run in the workspace with the prompt on stdin; "
        "{prompt_file}, {description_file}, {target} are filled in", metavar="CMD", run_only=True)
    agent_timeout: float = setting(
        900.0, "proposer", "kill the agent's whole process tree after this long per call", metavar="DURATION",
        run_only=True)
    max_fix_attempts: int = setting(
        2, "proposer", "fix requests for a trivially-crashed trial (default {default}; 0: no fixing)", metavar="N",
        run_only=True, ge=0)
    max_agent_failures: int = setting(
        5, "proposer", "stop after the agent failed N times in a row", metavar="N", run_only=True, ge=1)
    max_proposer_failures: int = setting(
        5, "proposer", "stop after N failed proposals in a row (the queue, the mutator)", metavar="N",
        run_only=True, ge=1)
    # The agent's preflight before the baseline and the watch that ends a call whose CLI only
    # keeps retrying (docs/proposers.md; proposers/preflight.py, proposers/agent_watch.py).
    skip_preflight: bool = setting(
        False, "proposer", "start without the agent's preflight checks (executable, version, login or API key; "
        "autoloop doctor shows them) for setups they do not know", run_only=True)
    agent_stall_timeout: float = setting(
        90.0, "proposer", "end an agent call whose CLI has kept printing only its retry messages this long "
        "(codex 'Reconnecting...', gemini 'Retrying with backoff'; default {default}; 0: off)",
        metavar="DURATION", run_only=True)

    # What the agent is told about the night (autoloop/store/digest.py).
    digest_kb: float = setting(
        8.0, "proposer", "the research digest in each agent prompt (kept changes, directions tried, crashes, "
        "notes) holds at most this many kB however long the night", metavar="KB", run_only=True, ge=1,
        allow_inf_nan=False)

    max_agent_cost: float | None = setting(
        None, "proposer", "stop the night cleanly once the agent calls of this tag have cost this many US dollars, "
        "as the CLIs report it (Claude Code and Aider do, Codex only tokens; nothing is estimated; calls in flight "
        "finish)", metavar="USD", run_only=True, default_text="no limit", gt=0, allow_inf_nan=False)

    # Propose the next trial while the current one trains (docs/proposers.md).
    lookahead: int | None = setting(
        None, "proposer", "1: while a trial trains, the proposer already prepares the next one in a worktree of its "
        "own (worktrees/ahead), so the device never waits for it; 0: propose, then train", metavar="0|1",
        run_only=True, ge=0, le=1, default_text="1 when the proposer is an agent, 0 for the mutator and the queue")

    # Optuna's sampler (--proposer optuna, and a portfolio's optuna member) and the
    # portfolio's members (docs/proposers.md).
    sampler: Literal["tpe", "cmaes", "gp"] = setting(
        "tpe", "proposer", "Optuna's sampler for --proposer optuna and a portfolio's optuna: tpe (Bayesian), "
        "cmaes (evolution strategy), gp (Gaussian process)", run_only=True)
    portfolio: list[str] | None = setting(
        None, "proposer", "the proposers that share the night, e.g. agent,optuna,mutate; giving it implies "
        "--proposer portfolio", metavar="LIST", run_only=True,
        default_text="with --proposer portfolio: agent if configured, optuna, mutate")

    @field_validator("portfolio", mode="before")
    @classmethod
    def _portfolio(cls, v: Any) -> Any:
        if isinstance(v, str):   # "agent,optuna,mutate" from the command line
            v = [p.strip() for p in v.split(",") if p.strip()]
        if isinstance(v, list):
            for name in v:
                if name not in PORTFOLIO_MEMBERS:
                    raise ValueError(f"unknown proposer {name!r} (a portfolio takes {', '.join(PORTFOLIO_MEMBERS)})")
            if len(set(v)) != len(v):
                raise ValueError(f"a proposer is listed twice: {','.join(v)}")
            if len(v) < 2:
                raise ValueError(f"a portfolio needs at least two proposers, got {','.join(v) or 'none'}")
        return v

    @model_validator(mode="after")
    def _portfolio_needs_its_proposer(self) -> Settings:
        if self.portfolio is not None and self.proposer not in ("portfolio", "auto"):
            raise ValueError(f"portfolio: only used with proposer 'portfolio' (the proposer is '{self.proposer}')")
        return self

    # -- what a trial may use (docs/safety.md) -------------------------------------------------
    max_rss_gb: float | None = setting(
        None, "safety", "kill a trial whose processes use more memory than this", metavar="GB", gt=0)
    log_cap_mb: float = setting(
        32.0, "safety", "keep each run log under MB: its first and last halves around a line saying what was "
        "cut (default {default}; 0: no cap)", metavar="MB", ge=0, allow_inf_nan=False)
    min_free_gb: float = setting(
        2.0, "safety", "stop before a trial when the workspace, results or data disk has less free "
        "(default {default}; 0: off)", metavar="GB", ge=0, allow_inf_nan=False)
    isolate: bool = setting(
        False, "safety", "run trials without network access, in a network namespace of their own (Linux)")

    # -- parallel workers (docs/parallel.md) ------------------------------------------
    workers: int = setting(
        1, "workers", "run N trials at once, each in its own git worktree under worktrees/", metavar="N",
        run_only=True, ge=1, le=64)
    devices: list[int] | None = setting(
        None, "workers", "CUDA devices of the workers, one each: 0,1,2,3", metavar="LIST", run_only=True,
        default_text="one GPU per worker when there are enough, else all on CPU, sharing the cores")
    gpus_per_trial: int = setting(
        1, "workers", "GPUs per trial: above 1, train.py runs as N ranks through torch.distributed.run and "
        "--workers W takes W groups of N GPUs; with --device cpu, N CPU ranks (gloo)", metavar="N", ge=0, le=64)

    # -- where trials run (docs/clusters.md) --------------------------------
    executor: Literal["local", "slurm", "ray"] = setting(
        "local", "slurm", "where trials run: local, slurm (one job per trial through submitit), or ray (one "
        "actor per trial, or per node of a trial, on a Ray cluster, placed by Ray)")
    ray_address: str | None = setting(
        None, "slurm", "the Ray cluster of --executor ray: its head's HOST:PORT, or ray://HOST:PORT",
        metavar="ADDRESS", default_text="RAY_ADDRESS of the environment, else a local Ray cluster started for "
        "the night and stopped after it")
    slurm_cluster: Literal["slurm", "local", "debug"] = setting(
        "slurm", "slurm", "submitit cluster: slurm (sbatch), or local/debug to try it without a cluster")
    slurm_mode: Literal["auto", "jobs", "steps"] = setting(
        "auto", "slurm", "jobs: one sbatch job per trial; steps: each trial a step (srun --exact) of the "
        "allocation the loop runs in (an sbatch script or salloc); auto: steps where SLURM_JOB_ID is set, "
        "else jobs")
    slurm_partition: str | None = setting(None, "slurm", "sbatch --partition", metavar="NAME")
    slurm_gpus_per_trial: int | None = setting(
        None, "slurm", "deprecated: the same as --gpus-per-trial", metavar="N", ge=0,
        default_text="--gpus-per-trial when given, else 1 where the partition has GPUs (sinfo's GRES), else 0")
    nodes_per_trial: int = setting(
        1, "slurm", "nodes per trial (Slurm: its job's, or its step's inside an allocation; Ray: a placement group "
        "of one bundle per node, STRICT_SPREAD); above 1, torchrun on each node meets at the first node's",
        metavar="M", ge=1)
    slurm_time_limit: float | None = setting(
        None, "slurm", "the job's time limit, e.g. 20m", metavar="DURATION",
        default_text="the trial timeout + 5m, rounded up to minutes")
    slurm_options: dict[str, str | int | float | bool] = setting(
        {}, "slurm", "extra sbatch option as submitit names it, e.g. account=myproj or mem=64G (repeatable)",
        metavar="KEY=VALUE", flag="--slurm-option")
    slurm_setup: list[str] = setting(
        [], "slurm", "a shell line the job runs before the trial, e.g. 'module load cuda/12.4' or "
        "'source .venv/bin/activate' (repeat the flag)", metavar="LINE", flag="--slurm-setup", repeatable=True)
    slurm_container: str | None = setting(
        None, "slurm", "run the trial's job in a container: pyxis:IMAGE (srun --container-image) or "
        "apptainer:IMAGE (apptainer exec --nv); the image needs autoloop[slurm]", metavar="RUNTIME:IMAGE")
    slurm_cpus_per_gpu: int | None = setting(
        None, "slurm", "CPUs per GPU of a trial's job (sbatch and srun --cpus-per-task: this x its GPUs)",
        metavar="N", ge=1, default_text="a GPU's share of the partition's node (sinfo: its CPUs / its GPUs)")
    slurm_mem_per_gpu: str | None = setting(
        None, "slurm", "memory per GPU of a trial's job, e.g. 64G (sbatch --mem-per-gpu)", metavar="SIZE",
        default_text="a GPU's share of the partition's node (sinfo: its memory / its GPUs)")
    slurm_exclusive: bool = setting(
        False, "slurm", "whole nodes per trial: sbatch --exclusive and --mem=0 (all their CPUs and memory)")
    slurm_folder: str = setting(DEFAULT_SLURM_DIR, "slurm", "submitit's job files", metavar="DIR")
    slurm_retries: int = setting(
        3, "slurm", "submit a trial again this many times when the cluster ends its job (preempted, node "
        "failure, lost, past slurm_pending_timeout; with --executor ray: its node died), after 30 s, 60 s, ... "
        "(up to 5m); not counted against the "
        "change (default {default})",
        metavar="N", ge=0, le=20)
    max_cluster_ends: int = setting(
        3, "slurm", "stop the night when the cluster ended this many trials in a row past their retries "
        "(preempted, node failure, lost, queue limit: recorded as ended, never against the change), rather "
        "than burn the queue (default {default})", metavar="N", run_only=True, ge=1)
    slurm_pending_timeout: float | None = setting(
        3600.0, "slurm", "cancel a trial's job still waiting in the queue after this long and submit it again "
        "(slurm_retries), then record the trial as ended by the cluster, so that a stuck queue cannot hold the "
        "night (default {default}; "
        "0: wait forever)",
        metavar="DURATION")

    @field_validator("slurm_time_limit", mode="before")
    @classmethod
    def _slurm_time_limit(cls, v: Any) -> float | None:
        return None if v is None else cls._duration(v)

    @field_validator("slurm_container")
    @classmethod
    def _slurm_container(cls, v: str | None) -> str | None:
        if v is None:
            return None
        runtime, _, image = v.strip().partition(":")
        if runtime not in ("pyxis", "apptainer") or not image.strip() or any(c.isspace() for c in image):
            raise ValueError(f"expected pyxis:IMAGE or apptainer:IMAGE, got {v!r}")
        return f"{runtime}:{image.strip()}"

    @field_validator("slurm_mem_per_gpu")
    @classmethod
    def _slurm_mem_per_gpu(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\d+[KMGT]?", v.strip(), re.IGNORECASE):
            raise ValueError(f"expected a size like 64G or 16000M, got {v!r}")
        return None if v is None else v.strip().upper()

    @field_validator("slurm_setup", mode="before")
    @classmethod
    def _slurm_setup(cls, v: Any) -> Any:
        lines = [v] if isinstance(v, str) else v   # one line given as a string
        if isinstance(lines, list) and any(isinstance(line, str) and "\n" in line.strip() for line in lines):
            raise ValueError("one shell line per entry (a list of lines, no newlines inside one)")
        return lines

    @field_validator("slurm_pending_timeout", mode="before")
    @classmethod
    def _slurm_pending_timeout(cls, v: Any) -> float | None:
        if v is None or (not isinstance(v, bool) and str(v).strip() in ("0", "0s", "0.0")):
            return None   # 0: no limit
        return cls._duration(v)

    @model_validator(mode="after")
    def _fold_slurm_gpus(self) -> Settings:
        # slurm_gpus_per_trial was the Slurm executor's own setting; gpus_per_trial now says it
        # for every executor. The old key still counts (with a note) when the new one is not set,
        # and it mirrors the new one (outside validation) for readers of the old name when set.
        if "slurm_gpus_per_trial" in self.model_fields_set and "gpus_per_trial" not in self.model_fields_set:
            _deprecated("slurm_gpus_per_trial (--slurm-gpus-per-trial) is deprecated: use gpus_per_trial "
                        "(--gpus-per-trial)")
            self.__dict__["gpus_per_trial"] = self.slurm_gpus_per_trial
        if self.model_fields_set & {"gpus_per_trial", "slurm_gpus_per_trial"}:
            self.__dict__["slurm_gpus_per_trial"] = self.gpus_per_trial
        # Neither given: a Slurm job asks for a GPU only where the partition has one (sinfo).
        return self

    @model_validator(mode="after")
    def _slurm_limit_after_timeout(self) -> Settings:
        # The scheduler would kill every trial before the harness's own timeout could.
        if self.slurm_time_limit is not None and self.slurm_time_limit <= self.timeout_s:
            raise ValueError(f"slurm_time_limit: must be longer than the trial timeout "
                             f"({format_duration(self.timeout_s)}), got {format_duration(self.slurm_time_limit)}")
        return self

    @field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, v: Any) -> Any:
        if isinstance(v, str):   # "0,1,2" from the command line
            parts = [p.strip() for p in v.split(",")]
            if not all(p.isdigit() for p in parts):
                raise ValueError(f"must be CUDA device numbers separated by commas (e.g. 0,1), got {v!r}")
            v = [int(p) for p in parts]
        if isinstance(v, list) and len(set(v)) != len(v):
            raise ValueError(f"a device is listed twice: {v}")
        return v

    # -- watching the night (docs/watching.md) ----------------------------------------
    track: list[Literal["wandb", "mlflow"]] = setting(
        [], "watch", "send every attempt to an experiment tracker as one run, grouped by the night: "
        "wandb or mlflow (optional extras autoloop[wandb], autoloop[mlflow]); repeat or list with "
        "commas. A tracker failure is one warning, never a stop", metavar="NAME", run_only=True,
        repeatable=True)

    notify: list[str] = setting(
        [], "watch", "send the night's events (a new best, a streak of crashes or proposer failures, a stop by "
        "an error, low disk, the end) to this apprise URL: slack://, discord://, tgram://, ntfy://, mailto://, "
        "json://host/path, ... (optional extra autoloop[notify]; repeatable). ${VAR} in it is read from the "
        "environment when sending, so a secret never sits in a file", metavar="URL", run_only=True,
        repeatable=True)
    notify_every: float = setting(
        600.0, "watch", "at most one notification of each kind of event this often, e.g. 10m (the stop and "
        "the end always go out; 0: no limit)", metavar="DURATION", run_only=True)
    hooks: dict[str, str] = setting(
        {}, "watch", "run CMD on EVENT (new_best, crash_streak, proposer_failures, stopped_by_error, low_disk, "
        "night_end; repeat the flag; a [hooks] table in the config file), the event as JSON on its stdin",
        metavar="EVENT=CMD", flag="--on", run_only=True)
    hook_timeout: float = setting(
        60.0, "watch", "end a hook's whole process tree after this long", metavar="DURATION", run_only=True)

    @field_validator("notify", mode="before")
    @classmethod
    def _notify(cls, v: Any) -> Any:
        items = [v] if isinstance(v, str) else v
        if isinstance(items, list) and all(isinstance(i, str) for i in items):
            urls = [i.strip() for i in items if i.strip()]
            for url in urls:
                if "://" not in url:
                    raise ValueError(f"{url!r} is not a notification URL (SCHEME://..., e.g. ntfy://topic)")
            return list(dict.fromkeys(urls))
        return v

    @field_validator("hooks", mode="before")
    @classmethod
    def _hooks(cls, v: Any) -> Any:
        from autoloop.core.night_events import EVENT_KINDS

        if isinstance(v, dict):
            for event, command in v.items():
                if event not in EVENT_KINDS:
                    raise ValueError(f"unknown event {event!r} (one of {', '.join(EVENT_KINDS)})")
                if not isinstance(command, str) or not command.strip():
                    raise ValueError(f"{event}: the command is empty")
        return v

    @field_validator("track", mode="before")
    @classmethod
    def _track(cls, v: Any) -> Any:
        # "wandb,mlflow" from one flag, several --track flags, a TOML string or list.
        items = [v] if isinstance(v, str) else v
        if isinstance(items, list) and all(isinstance(i, str) for i in items):
            names = [n.strip().lower() for i in items for n in i.split(",") if n.strip()]
            return list(dict.fromkeys(names))
        return v

    # -- verification (docs/verification.md; verification/verify.py) -----------------------
    verify_repeats: int | None = setting(
        None, "verify", "runs of each variant (the best, the baseline, the best without each kept change), with "
        "new seeds; the intervals need 2 or more (default: chosen from the night's noise to see the smallest kept "
        "gain with --power, 2 to 10; 3 where no noise was measured)", metavar="R", flag="--repeats",
        run_only=True, ge=1, le=100)
    verify_power: float = setting(
        0.8, "verify", "the power asked of a count of runs: the repeats a verification chooses to see the smallest "
        "kept gain at a two-sided 5%, and the runs the keep rule's confirmation of a within-noise gain is judged on "
        "(at most 3 more; default {default}); the report names the kept changes whose runs were under-powered",
        metavar="P",
        flag="--power", run_only=True, gt=0.5, lt=1.0)
    verify_scale: dict[str, str] = setting(
        {}, "verify", "transfer: also run the baseline, the best and the best without each confirmed change with "
        "the target's constant KEY set to VALUE (repeat the flag: --scale DEPTH=6 --scale WIDTH=256)",
        metavar="KEY=VALUE", flag="--scale", run_only=True)
    verify_budget: float | None = setting(
        None, "verify", "transfer: the training time of the runs at scale, e.g. 15m", metavar="DURATION",
        flag="--scale-budget", run_only=True, default_text="the night's budget")

    @field_validator("verify_scale", mode="before")
    @classmethod
    def _scale(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for key in v:
                if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(key)):
                    raise ValueError(f"{key!r} is not a constant's name")
            return {str(k): str(val) for k, val in v.items()}
        return v

    # Where the file settings came from (for messages); not a setting itself.
    _source: str | None = PrivateAttr(default=None)

    # -- validators ----------------------------------------------------------------------------

    @model_validator(mode="before")
    @classmethod
    def _no_bools_for_numbers(cls, data: Any) -> Any:
        # bool is an int subclass: without this, `budget = true` would mean 1 second.
        if isinstance(data, dict):
            for key, value in data.items():
                if isinstance(value, bool) and key in numeric_fields():
                    raise ValueError(f"{key}: must be a number, got {_show(value)}")
        return data

    @field_validator("budget", "agent_timeout", "hook_timeout", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        try:
            return parse_duration(v)
        except ConfigError as e:
            raise ValueError(str(e)) from None

    @field_validator("agent_stall_timeout", "notify_every", mode="before")
    @classmethod
    def _stall_timeout(cls, v: Any) -> float:
        # 0 or "off" turns the watch off; anything else is a duration like the others.
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if v < 0:
                raise ValueError(f"must be 0 (off) or a duration, got {_show(v)}")
            if v == 0:
                return 0.0
        if isinstance(v, str) and v.strip().lower() in ("0", "off"):
            return 0.0
        return cls._duration(v)

    @field_validator("timeout", "verify_budget", "scout", mode="before")
    @classmethod
    def _optional_duration(cls, v: Any) -> float | None:
        return None if v is None else cls._duration(v)

    @field_validator("target")
    @classmethod
    def _relative_target(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must name a file")
        if PurePosixPath(v).is_absolute() or PureWindowsPath(v).is_absolute() or PureWindowsPath(v).drive:
            raise ValueError(f"must be a path relative to the repository, got {v!r}")
        parts = PurePosixPath(v.replace("\\", "/")).parts
        if ".." in parts:
            raise ValueError(f"must stay inside the repository (no '..'), got {v!r}")
        return PurePosixPath(*parts).as_posix()   # './train.py' -> 'train.py'

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: Any) -> Any:
        if isinstance(v, list):   # TOML: command = ["python", "train.py"] is natural too
            if not v or not all(isinstance(a, str) for a in v):
                raise ValueError("must be a string or a list of strings")
            return shlex.join(v)
        if isinstance(v, str):
            try:
                argv = shlex.split(v)
            except ValueError as e:
                raise ValueError(f"cannot split {v!r} into arguments ({e})") from None
            if not argv:
                raise ValueError("must not be empty")
        return v

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        if not _METRIC.match(v):
            raise ValueError(f"must be a name of letters, digits and _ (like val_bpb), got {v!r}")
        return v

    @field_validator("tag")
    @classmethod
    def _tag(cls, v: str | None) -> str | None:
        if v is None:
            return v
        # It becomes a git ref component: keep to what git check-ref-format accepts, simply.
        if (not _TAG.match(v) or ".." in v or v.startswith((".", "-"))
                or v.endswith((".", ".lock"))):
            raise ValueError(f"must be letters, digits, '.', '_' or '-' usable in a git branch "
                             f"name (no '..', not starting with '.' or '-'), got {v!r}")
        return v

    @field_validator("device", mode="before")
    @classmethod
    def _device(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.strip().lower()
            if v == "auto":
                return None
            if not _DEVICE.match(v):
                raise ValueError(f"must be cpu, cuda, cuda:N, mps or auto, got {v!r}")
        return v

    @field_validator("log_cap_mb")
    @classmethod
    def _log_cap(cls, v: float) -> float:
        if 0 < v < MIN_LOG_CAP_MB:
            raise ValueError(f"must be 0 (no cap) or at least {MIN_LOG_CAP_MB:g}, got {v:g}")
        return v

    @model_validator(mode="after")
    def _devices_per_worker(self) -> Settings:
        if self.devices is not None and len(self.devices) < self.workers:
            raise ValueError(f"devices: {len(self.devices)} listed for {self.workers} workers; "
                             f"give one per worker")
        return self

    @model_validator(mode="after")
    def _timeout_after_budget(self) -> Settings:
        # The hard limit also covers start-up and evaluation, so at or under the budget
        # it would kill every trial.
        if self.timeout is not None and self.timeout <= self.budget:
            raise ValueError(f"timeout: must be longer than the budget ({format_duration(self.budget)}), "
                             f"got {format_duration(self.timeout)}")
        if self.scout is not None and self.scout >= self.budget:
            raise ValueError(f"scout: must be shorter than the budget ({format_duration(self.budget)}), "
                             f"got {format_duration(self.scout)}")
        return self

    # -- derived values ------------------------------------------------------------------------

    @property
    def timeout_s(self) -> float:
        """The hard limit per trial: the configured timeout, else max(2 x budget, budget + 120 s)."""
        return self.timeout if self.timeout is not None else default_timeout(self.budget)

    @property
    def command_argv(self) -> list[str]:
        """The trial command as argv: shlex-split ``command``, else [this python, target]."""
        if self.command is None:
            return [sys.executable, self.target]
        return shlex.split(self.command)

    @property
    def run_tag(self) -> str:
        """The tag in force: the configured one, else today's date ('nov29')."""
        return self.tag or date_tag()

    @property
    def branch(self) -> str:
        """The loop's branch for the tag in force (layout.branch_name)."""
        return branch_name(self.run_tag)

    @property
    def source(self) -> str | None:
        """The config file the settings came from ('autoloop.toml', 'pyproject.toml
        [tool.autoloop]'), or None when only defaults and overrides apply."""
        return self._source


SETTING_NAMES = tuple(Settings.model_fields)


def flag_of(name: str) -> str:
    """The flag of a setting: its declared one, else --<name with dashes>."""
    extra = Settings.model_fields[name].json_schema_extra   # setting() always gives a dict
    flag = extra.get("flag") if isinstance(extra, dict) else None
    return flag if isinstance(flag, str) and flag else f"--{name.replace('_', '-')}"


def numeric_fields() -> frozenset[str]:
    """Settings that take numbers (durations included): a TOML true/false there is a
    mistake, not 1/0."""
    return _NUMERIC


def _is_number(annotation: Any) -> bool:
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    return all(a in (int, float) for a in args)


_NUMERIC = frozenset(name for name, f in Settings.model_fields.items() if _is_number(f.annotation))
