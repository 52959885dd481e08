"""Loading the settings: [tool.autoloop] / autoloop.toml, then CLI overrides (``settings.py`` declares them).

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
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from autoloop.config.settings import SETTING_NAMES, Settings, flag_of
from autoloop.core.durations import show as _show
from autoloop.core.errors import ConfigError

__all__ = ["AUTOLOOP_TOML", "PYPROJECT", "PYPROJECT_LABEL", "ConfigError", "build_settings", "load_settings",
           "read_config_file"]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PYPROJECT = "pyproject.toml"
AUTOLOOP_TOML = "autoloop.toml"
PYPROJECT_LABEL = "pyproject.toml [tool.autoloop]"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path.name}: invalid TOML: {_one_line(str(e))}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path.name}: invalid TOML: not UTF-8 text") from None
    except OSError as e:
        raise ConfigError(f"{path.name}: cannot read: {e.strerror or e}") from None


def read_config_file(workdir: Path) -> tuple[str | None, dict[str, Any]]:
    """(label of the file, its settings table) from the workspace root; (None, {}) when none."""
    workdir = Path(workdir)
    found: list[tuple[str, dict[str, Any]]] = []
    own = workdir / AUTOLOOP_TOML
    if own.is_file():
        table = _read_toml(own)
        if table:
            found.append((AUTOLOOP_TOML, table))
    pyproject = workdir / PYPROJECT
    if pyproject.is_file():
        tool = _read_toml(pyproject).get("tool", {})
        ours = tool.get("autoloop") if isinstance(tool, dict) else None
        if ours is not None:
            if not isinstance(ours, dict):
                raise ConfigError(f"{PYPROJECT}: tool.autoloop must be a table ([tool.autoloop])")
            if ours:
                found.append((PYPROJECT_LABEL, ours))
    if len(found) > 1:
        raise ConfigError(f"settings in both {AUTOLOOP_TOML} and {PYPROJECT_LABEL}; keep them in one")
    return found[0] if found else (None, {})


def _normalise(table: dict[str, Any], where: str, flag_style: bool) -> dict[str, tuple[Any, str]]:
    """key -> (value, location label). '-' accepted for '_'; unknown keys rejected with a hint."""
    out: dict[str, tuple[Any, str]] = {}
    for raw_key, value in table.items():
        key = str(raw_key).replace("-", "_")
        label = (flag_of(key) if key in SETTING_NAMES else f"--{raw_key}") if flag_style else f"{where}: {raw_key}"
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


def load_settings(workdir: Path, overrides: dict[str, Any] | None = None) -> Settings:
    """Settings from the workspace's config files, with non-None overrides applied on top."""
    source, table = read_config_file(workdir)
    merged = _normalise(table, source or "", flag_style=False)
    cli = {k: v for k, v in (overrides or {}).items() if v is not None}
    cli_values = _normalise(cli, "", flag_style=True)
    for key in ("slurm_options", "hooks"):
        if key in cli_values and isinstance(merged.get(key, (None,))[0], dict):
            # --slurm-option KEY=VALUE and --on EVENT=CMD add to the file's table rather than replacing it.
            cli_values[key] = ({**merged[key][0], **cli_values[key][0]}, cli_values[key][1])
    merged.update(cli_values)   # CLI wins
    settings = build_settings({k: v for k, (v, _) in merged.items()},
                              {k: label for k, (_, label) in merged.items()})
    settings._source = source
    return settings


def build_settings(values: dict[str, Any], labels: dict[str, str] | None = None) -> Settings:
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


def _message(err: ErrorDetails) -> str:
    """A pydantic error as a short predicate ('must be positive')."""
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    value = err.get("input")
    if kind == "value_error":
        return str(ctx.get("error", err.get("msg", "invalid")))
    # A number out of bounds is shown as typed: a flag's value is the string '0', not 0.
    number = value if isinstance(value, str) else _show(value)
    if kind == "greater_than":
        bound = "must be positive" if ctx.get("gt") == 0 else f"must be greater than {_show(ctx.get('gt'))}"
        return f"{bound}, got {number}"
    if kind == "greater_than_equal":
        return f"must be at least {_show(ctx.get('ge'))}, got {number}"
    if kind == "less_than_equal":
        return f"must be at most {_show(ctx.get('le'))}, got {number}"
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


def _one_line(text: str) -> str:
    return " ".join(text.split())
