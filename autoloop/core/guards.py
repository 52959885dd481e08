"""Metric guards: conditions on a trial's secondary metrics that a keep must also meet.

A guard is one line of a small grammar, parsed once at start::

    NAME OP NUMBER [* baseline]        OP: <=  <  >=  >
    NAME OP baseline                   (the same as 1 * baseline)

``peak_vram_mb <= 1.10 * baseline`` holds when the candidate's ``peak_vram_mb`` is at
most 1.10 times the baseline's; ``num_params_M <= 120`` is absolute. NAME is any
``NAME: value`` line the trial prints (the summary block of train.py, or a foreign
command's lines). A name the candidate does not print, or prints as nan/inf, breaches the
guard: a win that cannot show it fits is not a win.

Pure: parsing, the limit, and the breaches of one attempt's metrics; no files, no runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

OPS = ("<=", ">=", "<", ">")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_GUARD = re.compile(rf"^\s*({_NAME})\s*(<=|>=|<|>)\s*(?:({_NUMBER})\s*(\*\s*baseline)?|(baseline))\s*$")
HINT = "write NAME OP NUMBER [* baseline], OP one of <= < >= >, e.g. 'peak_vram_mb <= 1.10 * baseline'"


@dataclass(frozen=True)
class Guard:
    name: str
    op: str
    number: float
    relative: bool      # the number is a factor of the baseline's value

    @property
    def text(self) -> str:
        """The guard as a person writes it (canonical spacing)."""
        rhs = f"{self.number:g} * baseline" if self.relative else f"{self.number:g}"
        return f"{self.name} {self.op} {rhs}"

    def limit(self, baseline: Mapping[str, float]) -> float | None:
        """The number the value is compared with; None: relative and the baseline lacks it."""
        if not self.relative:
            return self.number
        base = baseline.get(self.name)
        return None if base is None else self.number * base

    def holds(self, value: float, limit: float) -> bool:
        if not (math.isfinite(value) and math.isfinite(limit)):
            return False
        return {"<=": value <= limit, "<": value < limit, ">=": value >= limit, ">": value > limit}[self.op]


@dataclass(frozen=True)
class Breach:
    guard: Guard
    value: float | None     # None: the attempt did not print the name
    limit: float | None

    @property
    def reason(self) -> str:
        """One line naming the guard and both numbers."""
        if self.value is None:
            return f"guard {self.guard.text} breached: {self.guard.name} not printed"
        return (f"guard {self.guard.text} breached: {self.guard.name} {self.value:g} vs limit "
                f"{_limit_text(self.guard, self.limit)}")

    def as_dict(self) -> dict[str, object]:
        return {"guard": self.guard.text, "name": self.guard.name, "value": self.value, "limit": self.limit}


def _limit_text(guard: Guard, limit: float | None) -> str:
    if limit is None:
        return "unknown"
    if guard.relative:
        return f"{limit:g} ({guard.number:g} x baseline {limit / guard.number:g})" if guard.number else f"{limit:g}"
    return f"{limit:g}"


def parse_guard(text: str) -> Guard:
    """One guard, or ValueError with one line saying what is wrong and how to write it."""
    found = _GUARD.match(text)
    if not found:
        raise ValueError(f"cannot read {text!r} as a guard ({HINT})")
    name, op, number, times, alone = found.groups()
    if alone:
        return Guard(name, op, 1.0, True)
    value = float(number)
    if times and value <= 0:
        raise ValueError(f"{text!r}: the factor of the baseline must be positive")
    return Guard(name, op, value, bool(times))


def parse_guards(texts: Iterable[str]) -> tuple[Guard, ...]:
    return tuple(parse_guard(t) for t in texts)


def breaches(guards: Iterable[Guard], metrics: Mapping[str, float], baseline: Mapping[str, float]) -> list[Breach]:
    """The guards this attempt's metrics break (none: every guard holds)."""
    out = []
    for guard in guards:
        limit = guard.limit(baseline)
        value = metrics.get(guard.name)
        if value is None or limit is None or not guard.holds(value, limit):
            out.append(Breach(guard, value, limit))
    return out


def missing_in_baseline(guards: Iterable[Guard], baseline: Mapping[str, float]) -> list[str]:
    """The names the guards read that the baseline did not print (a guard on one could never hold)."""
    return list(dict.fromkeys(g.name for g in guards if g.name not in baseline))


def finite_metrics(values: Mapping[str, float]) -> dict[str, float]:
    """What a record keeps of the printed values: finite numbers only (JSON has no nan)."""
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}
