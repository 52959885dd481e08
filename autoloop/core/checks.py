"""One health check's verdict, as `autoloop doctor` and the agent preflight print it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    """``ok``: fine; ``warn``: works, but worth knowing; ``fail``: autoloop run would not
    get far (doctor exits non-zero, the preflight refuses to start)."""

    name: str       # what was checked: "git identity", "claude auth"
    status: Status
    detail: str     # one line; never a secret (variable names only, never their values)

    def line(self) -> str:
        return f"{self.status:<4}  {self.name}: {self.detail}"


def ok(name: str, detail: str) -> Check:
    return Check(name, "ok", detail)


def warn(name: str, detail: str) -> Check:
    return Check(name, "warn", detail)


def fail(name: str, detail: str) -> Check:
    return Check(name, "fail", detail)


def failures(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == "fail"]
