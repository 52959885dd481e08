"""Durations as people write them: ``300``, ``"300s"``, ``"5m"``, ``"1h30m"``; and back."""

from __future__ import annotations

import math
import re

from autoloop.core.errors import ConfigError

DURATION_HINT = "use 300, 300s, 5m or 1h30m"

# h, m, s components in that order, each optional but at least one present; spaces between allowed.
_DURATION = re.compile(
    r"^(?:(?P<h>\d+(?:\.\d+)?)\s*h)?\s*(?:(?P<m>\d+(?:\.\d+)?)\s*m)?\s*(?:(?P<s>\d+(?:\.\d+)?)\s*s)?$"
)


def default_timeout(budget_s: float) -> float:
    """The hard limit of a trial when none is configured: max(2 x budget, budget + 2m). It
    covers start-up and evaluation too, which do not shrink with the budget."""
    return max(2 * budget_s, budget_s + 120)


def parse_duration(text: object) -> float:
    """'300', '300s', '5m', '1h30m', 90 -> seconds.

    Rejects zero, negative, non-finite and unreadable values with a ConfigError whose
    message has no location (the loader adds it).
    """
    if isinstance(text, bool) or not isinstance(text, (int, float, str)):
        raise ConfigError(f"cannot read {show(text)} as a duration ({DURATION_HINT})")
    seconds: float | None
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
    if seconds is None or not math.isfinite(seconds):
        raise ConfigError(f"cannot read {show(text)} as a duration ({DURATION_HINT})")
    if seconds <= 0:
        raise ConfigError(f"must be positive, got {show(text)}")
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


def show(value: object) -> str:
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


def expected_seconds(kept: int, repeats: int, per_run: float, scale: dict[str, str], budget: float,
                     scale_budget: float | None) -> float:
    """About how long a verification of ``kept`` kept changes takes (`run --verify-at-end`
    keeps this much of --hours): R runs of the best, the baseline and each change, then at
    scale (when asked) as many again, each run ``per_run`` seconds (longer in proportion to
    the budget at scale). An upper bound: at scale only the confirmed changes run."""
    if kept <= 0:
        return 0.0
    runs = repeats * (2 + kept)
    total = runs * per_run
    if scale or scale_budget is not None:
        factor = (scale_budget / budget) if scale_budget is not None and budget > 0 else 1.0
        total += runs * per_run * max(1.0, factor)
    return total
