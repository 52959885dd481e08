"""Settings: pydantic models, loaded from [tool.autoloop] / autoloop.toml, then CLI overrides.

Where settings come from, lowest priority first:

1. the defaults in :class:`Settings`;
2. ONE config file in the workspace root: either ``autoloop.toml`` (settings as
   top-level keys) or the ``[tool.autoloop]`` table of ``pyproject.toml``. When both
   define settings, loading fails with a ConfigError asking to keep one: silently
   preferring one file would leave the user editing the one that is ignored. An
   empty ``autoloop.toml`` or a pyproject.toml without ``[tool.autoloop]`` counts as
   not defining settings.
3. CLI overrides: a dict of setting name -> value where None means "flag not given".

Keys are the field names of :class:`Settings`; in TOML ``-`` may be written for
``_`` (``max-trials = 20``). Durations (budget, timeout, agent_timeout) accept a number
of seconds or a string: ``300``, ``"300s"``, ``"5m"``, ``"1h30m"``.

Every problem is a :class:`ConfigError` with one line that names where the bad value
came from, ``<file>: <key>: <problem>`` or ``--<flag>: <problem>``, e.g.::

    pyproject.toml [tool.autoloop]: unknown setting 'bugdet' (did you mean 'budget'?)
    --budget: cannot read '5 minutes' as a duration (use 300, 300s, 5m or 1h30m)
    autoloop.toml: budget: must be positive
    autoloop.toml: invalid TOML: Expected '=' after a key in a key/value pair (at line 2, column 8)
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
import sys
import time
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class ConfigError(Exception):
    """A bad setting; the message is one line for the user."""


# ---------------------------------------------------------------------------------------------
# durations

DURATION_HINT = "use 300, 300s, 5m or 1h30m"
# h, m, s components in that order, each optional but at least one present; spaces between allowed.
_DURATION = re.compile(
    r"^(?:(?P<h>\d+(?:\.\d+)?)\s*h)?\s*(?:(?P<m>\d+(?:\.\d+)?)\s*m)?\s*(?:(?P<s>\d+(?:\.\d+)?)\s*s)?$"
)


def parse_duration(text) -> float:
    """'300', '300s', '5m', '1h30m', 90 -> seconds.

    Rejects zero, negative, non-finite and unreadable values with a ConfigError whose
    message has no location (the loader adds it).
    """
    if isinstance(text, bool) or not isinstance(text, (int, float, str)):
        raise ConfigError(f"cannot read {_show(text)} as a duration ({DURATION_HINT})")
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        s = text.strip().lower()
        seconds = None
        if re.fullmatch(r"[+-]?\d+(?:\.\d*)?|[+-]?\.\d+", s):   # a bare number of seconds
            seconds = float(s)
        else:
            m = _DURATION.match(s)
            if s and m and any(m.group(k) for k in "hms"):
                seconds = sum(float(m.group(k) or 0) * f for k, f in (("h", 3600), ("m", 60), ("s", 1)))
        if seconds is None:
            raise ConfigError(f"cannot read {_show(text)} as a duration ({DURATION_HINT})")
    if not math.isfinite(seconds):
        raise ConfigError(f"cannot read {_show(text)} as a duration ({DURATION_HINT})")
    if seconds <= 0:
        raise ConfigError(f"must be positive, got {_show(text)}")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds -> the shortest readable form: 300 -> '5m', 5400 -> '1h30m', 45 -> '45s'.

    Whole seconds from a minute up (sub-second detail is noise at that scale);
    below a minute fractions are kept: 0.5 -> '0.5s'.
    """
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    total = int(round(seconds))
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    parts = [f"{h}h" if h else "", f"{m}m" if m else "", f"{s}s" if s else ""]
    return "".join(parts)


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


# Fields that take numbers; a TOML true/false there is a mistake, not 1/0.
_NUMERIC_FIELDS = {"budget", "timeout", "hours", "max_trials", "min_delta", "seed", "max_rss_gb",
                   "agent_timeout", "max_proposer_failures", "max_fix_attempts", "max_agent_failures"}
_NUMERIC_FIELDS |= {"log_cap_mb", "min_free_gb"}
_NUMERIC_FIELDS |= {"slurm_gpus_per_trial", "slurm_time_limit"}
_NUMERIC_FIELDS |= {"workers"}
# The proposers a portfolio can share a night among (#18, proposers/portfolio.py).
PORTFOLIO_MEMBERS = ("agent", "optuna", "mutate", "queue")
# A smaller log cap would keep less of the output's end than the runner reads to classify a crash.
MIN_LOG_CAP_MB = 0.125


class Settings(BaseModel):
    """Every autoloop setting. Field names are the TOML keys and, with '-', the CLI flags."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # -- the experiment ------------------------------------------------------------------------
    budget: float = 300.0                      # training seconds per trial
    timeout: float | None = None               # hard limit per trial; None -> see timeout_s
    hours: float | None = Field(default=None, gt=0)        # stop starting trials after this long
    max_trials: int | None = Field(default=None, ge=1)     # stop after this many trials
    target: str = "train.py"                   # the one file a proposer may edit
    command: str | None = None                 # trial command; None -> python <target>
    metric: str = "val_bpb"
    direction: Literal["min", "max"] = "min"
    min_delta: float = Field(default=0.0, ge=0)            # a keep must beat best by more than this
    seed: int = 42
    # Noise (README "Noise"): extra seeds of the baseline, the keep rule and its z.
    noise_runs: int = Field(default=2, ge=0)   # extra baseline runs (seeds seed+1..) to estimate noise
    keep_rule: Literal["auto", "noise", "strict"] = "auto"   # auto: noise once an estimate exists
    noise_z: float = Field(default=2.0, gt=0)  # keep when improvement > max(min_delta, z x noise)
    remeasure: bool = False                    # re-run the best noise_runs times at start
    max_rss_gb: float | None = Field(default=None, gt=0)   # kill a trial whose tree grows past this
    # Integrity (README "Integrity"): a single-run gain over sanity_bound x |best| is re-run
    # before it can be kept; 0 turns the check off.
    sanity_bound: float = Field(default=0.1, ge=0, allow_inf_nan=False)

    @field_validator("sanity_bound", mode="before")
    @classmethod
    def _sanity_bound_number(cls, v: Any) -> Any:
        if isinstance(v, bool):   # `sanity_bound = true` is a mistake, not 1.0
            raise ValueError(f"must be a number, got {_show(v)}")
        return v

    # -- data ----------------------------------------------------------------------------------
    corpus: str = "stdlib"
    data_dir: str | None = None
    device: str | None = None                  # cpu | cuda | cuda:N | mps; None -> auto-detect
    # -- git / session -------------------------------------------------------------------------
    tag: str | None = None                     # branch autoloop/<tag>; None -> date (run_tag)
    resume: bool = False
    # -- proposers -----------------------------------------------------------------------------
    proposer: Literal["auto", "queue", "mutate", "agent", "optuna", "portfolio"] = "auto"
    queue_dir: str = "results/queue"
    agent_cmd: str | None = None
    agent: str | None = None                   # preset name of a known coding agent
    agent_timeout: float = 900.0
    max_proposer_failures: int = Field(default=5, ge=1)    # in a row, then the loop stops
    max_fix_attempts: int = Field(default=2, ge=0)         # fix requests per trivially-crashed trial
    max_agent_failures: int = Field(default=5, ge=1)
    # #18: Optuna's sampler (--proposer optuna, and the optuna member of a portfolio), and the
    # portfolio's members (README "Proposers").
    sampler: Literal["tpe", "cmaes", "gp"] = "tpe"
    portfolio: list[str] | None = None         # e.g. ["agent", "optuna", "mutate"]; None: see default_portfolio

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
    def _portfolio_needs_its_proposer(self) -> "Settings":
        if self.portfolio is not None and self.proposer not in ("portfolio", "auto"):
            raise ValueError(f"portfolio: only used with proposer 'portfolio' (the proposer is '{self.proposer}')")
        return self
    # -- resources and isolation ---------------------------------------------------------------
    log_cap_mb: float = Field(default=32.0, ge=0, allow_inf_nan=False)   # per run log; 0: no cap
    min_free_gb: float = Field(default=2.0, ge=0, allow_inf_nan=False)   # stop below this; 0: no check
    isolate: bool = False                      # trials without network (Linux network namespaces)
    # -- executor: where trials run (README "Running trials on a cluster") ---------------------
    executor: Literal["local", "slurm"] = "local"          # slurm: one submitit job per trial
    slurm_cluster: Literal["slurm", "local", "debug"] = "slurm"   # local/debug: submitit without a cluster
    slurm_partition: str | None = None
    slurm_gpus_per_trial: int = Field(default=1, ge=0)
    slurm_time_limit: float | None = None      # the job's limit (a duration); None -> timeout + 5m
    slurm_options: dict[str, str | int | float | bool] = Field(default_factory=dict)  # extra sbatch options
    slurm_folder: str = "results/slurm"        # submitit's job files; relative to the workspace

    @field_validator("slurm_time_limit", mode="before")
    @classmethod
    def _slurm_time_limit(cls, v: Any) -> float | None:
        return None if v is None else cls._duration(v)

    @model_validator(mode="after")
    def _slurm_limit_after_timeout(self) -> "Settings":
        # The scheduler would kill every trial before the harness's own timeout could.
        if self.slurm_time_limit is not None and self.slurm_time_limit <= self.timeout_s:
            raise ValueError(f"slurm_time_limit: must be longer than the trial timeout ({format_duration(self.timeout_s)}), "
                             f"got {format_duration(self.slurm_time_limit)}")
        return self

    # -- parallel workers (README "Parallel workers", workers.py) -------------------------------
    workers: int = Field(default=1, ge=1, le=64)   # trials run at once, each in its own git worktree
    devices: list[int] | None = None           # CUDA device of each worker; None -> one each if enough, else CPU

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

    # Where the file settings came from (for messages); not a setting itself.
    _source: str | None = PrivateAttr(default=None)

    # -- validators ----------------------------------------------------------------------------

    @model_validator(mode="before")
    @classmethod
    def _no_bools_for_numbers(cls, data: Any) -> Any:
        # bool is an int subclass: without this, `budget = true` would mean 1 second.
        if isinstance(data, dict):
            for key, value in data.items():
                if isinstance(value, bool) and key in _NUMERIC_FIELDS:
                    raise ValueError(f"{key}: must be a number, got {_show(value)}")
        return data

    @field_validator("budget", "agent_timeout", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        try:
            return parse_duration(v)
        except ConfigError as e:
            raise ValueError(str(e)) from None

    @field_validator("timeout", mode="before")
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
    def _devices_per_worker(self) -> "Settings":
        if self.devices is not None and len(self.devices) < self.workers:
            raise ValueError(f"devices: {len(self.devices)} listed for {self.workers} workers; "
                             f"give one per worker")
        return self

    @model_validator(mode="after")
    def _timeout_after_budget(self) -> "Settings":
        # The hard limit also covers start-up and evaluation, so at or under the budget
        # it would kill every trial.
        if self.timeout is not None and self.timeout <= self.budget:
            raise ValueError(f"timeout: must be longer than the budget ({format_duration(self.budget)}), "
                             f"got {format_duration(self.timeout)}")
        return self

    # -- derived values ------------------------------------------------------------------------

    @property
    def timeout_s(self) -> float:
        """The hard limit per trial: the configured timeout, else max(2 x budget, budget + 120 s)."""
        if self.timeout is not None:
            return self.timeout
        return max(2 * self.budget, self.budget + 120)

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
        return f"autoloop/{self.run_tag}"

    @property
    def source(self) -> str | None:
        """The config file the settings came from ('autoloop.toml', 'pyproject.toml
        [tool.autoloop]'), or None when only defaults and overrides apply."""
        return self._source


SETTING_NAMES = tuple(Settings.model_fields)


# ---------------------------------------------------------------------------------------------
# loading

PYPROJECT = "pyproject.toml"
AUTOLOOP_TOML = "autoloop.toml"
PYPROJECT_LABEL = "pyproject.toml [tool.autoloop]"


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path.name}: invalid TOML: {_one_line(str(e))}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path.name}: invalid TOML: not UTF-8 text") from None
    except OSError as e:
        raise ConfigError(f"{path.name}: cannot read: {e.strerror or e}") from None


def read_config_file(workdir: Path) -> tuple[str | None, dict]:
    """(label of the file, its settings table) from the workspace root; (None, {}) when none."""
    workdir = Path(workdir)
    found: list[tuple[str, dict]] = []
    own = workdir / AUTOLOOP_TOML
    if own.is_file():
        table = _read_toml(own)
        if table:
            found.append((AUTOLOOP_TOML, table))
    pyproject = workdir / PYPROJECT
    if pyproject.is_file():
        tool = _read_toml(pyproject).get("tool", {})
        table = tool.get("autoloop") if isinstance(tool, dict) else None
        if table is not None:
            if not isinstance(table, dict):
                raise ConfigError(f"{PYPROJECT}: tool.autoloop must be a table ([tool.autoloop])")
            if table:
                found.append((PYPROJECT_LABEL, table))
    if len(found) > 1:
        raise ConfigError(f"settings in both {AUTOLOOP_TOML} and {PYPROJECT_LABEL}; keep them in one")
    return found[0] if found else (None, {})


def _normalise(table: dict, where: str, flag_style: bool) -> dict[str, tuple[Any, str]]:
    """key -> (value, location label). '-' accepted for '_'; unknown keys rejected with a hint."""
    out: dict[str, tuple[Any, str]] = {}
    for raw_key, value in table.items():
        key = str(raw_key).replace("-", "_")
        label = f"--{key.replace('_', '-')}" if flag_style else f"{where}: {raw_key}"
        if key not in SETTING_NAMES:
            hint = difflib.get_close_matches(key, SETTING_NAMES, n=1, cutoff=0.6)
            suggestion = ""
            if hint:
                name = hint[0]
                if flag_style:
                    name = f"--{name.replace('_', '-')}"
                elif "-" in str(raw_key):
                    name = name.replace("_", "-")
                suggestion = f" (did you mean '{name}'?)"
            if flag_style:
                raise ConfigError(f"--{raw_key}: unknown setting{suggestion}")
            raise ConfigError(f"{where}: unknown setting {str(raw_key)!r}{suggestion}")
        if key in out:
            raise ConfigError(f"{label}: given twice (as '{key}' and with '-')")
        out[key] = (value, label)
    return out


def load_settings(workdir: Path, overrides: dict | None = None) -> Settings:
    """Settings from the workspace's config files, with non-None overrides applied on top."""
    source, table = read_config_file(workdir)
    merged = _normalise(table, source or "", flag_style=False)
    cli = {k: v for k, v in (overrides or {}).items() if v is not None}
    cli_values = _normalise(cli, "", flag_style=True)
    if "slurm_options" in cli_values and isinstance(merged.get("slurm_options", (None,))[0], dict):
        # --slurm-option KEY=VALUE adds to the file's table rather than replacing it.
        cli_values["slurm_options"] = ({**merged["slurm_options"][0], **cli_values["slurm_options"][0]},
                                       cli_values["slurm_options"][1])
    merged.update(cli_values)   # CLI wins
    settings = build_settings({k: v for k, (v, _) in merged.items()},
                              {k: label for k, (_, label) in merged.items()})
    settings._source = source
    return settings


def build_settings(values: dict, labels: dict[str, str] | None = None) -> Settings:
    """Validate values into Settings; a failure becomes ONE ConfigError line naming the
    key's origin from labels (key -> 'autoloop.toml: budget' or '--budget')."""
    labels = labels or {}
    try:
        return Settings(**values)
    except ValidationError as e:
        raise ConfigError(_explain(e, labels)) from None


def _explain(e: ValidationError, labels: dict[str, str]) -> str:
    err = e.errors()[0]
    loc = [str(p) for p in err.get("loc", ())]
    key = loc[0] if loc else None
    message = _message(err)
    if key is None:
        # A whole-model rule (timeout vs budget, bools): name the origin of the key it is about.
        m = re.match(r"(\w+): (.*)", message)
        if m and m.group(1) in SETTING_NAMES:
            key, message = m.group(1), m.group(2)
    label = labels.get(key, key) if key else "settings"
    return f"{label}: {message}"


def _message(err: dict) -> str:
    """A pydantic error as a short predicate ('must be positive')."""
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    value = err.get("input")
    if kind == "value_error":
        return str(ctx.get("error", err.get("msg", "invalid")))
    if kind == "greater_than":
        bound = "must be positive" if ctx.get("gt") == 0 else f"must be greater than {_show(ctx.get('gt'))}"
        return f"{bound}, got {_show(value)}"
    if kind == "greater_than_equal":
        return f"must be at least {_show(ctx.get('ge'))}, got {_show(value)}"
    if kind in ("int_parsing", "int_from_float", "int_type"):
        return f"must be a whole number, got {_show(value)}"
    if kind in ("float_parsing", "float_type", "finite_number"):
        return f"must be a number, got {_show(value)}"
    if kind in ("bool_parsing", "bool_type"):
        return f"must be true or false, got {_show(value)}"
    if kind == "string_type":
        return f"must be a string, got {_show(value)}"
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}, got {_show(value)}"
    return _one_line(str(err.get("msg", "invalid"))).lower()


def _show(value: Any) -> str:
    """A value as the user wrote it: strings quoted, TOML booleans lower-case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (dict, list)):
        return "a table" if isinstance(value, dict) else "a list"
    if isinstance(value, float):
        return f"{value:g}"   # 0.0 -> '0', as a person would write the bound
    return str(value)


def _one_line(text: str) -> str:
    return " ".join(text.split())
