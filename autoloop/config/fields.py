"""What one setting's field declares, read the same way by its flag and its documentation.

`autoloop run --help` (cli/flags.py) and docs/configuration.md (config/reference.py) both
show a setting's choices and default; reading them here once keeps the two from drifting.
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic.fields import FieldInfo

from autoloop.core.durations import format_duration


def meta(field: FieldInfo) -> dict[str, Any]:
    """What `setting()` put beside pydantic's own: section, metavar, run_only, choices, ..."""
    extra = field.json_schema_extra   # a dict on every Settings field (pydantic also allows a callable)
    return extra if isinstance(extra, dict) else {}


def choices(field: FieldInfo) -> list[Any] | None:
    """The values the flag accepts: declared, or the members of a Literal annotation."""
    declared = meta(field).get("choices")
    if declared is not None:
        return list(declared())
    args = [a for a in typing.get_args(field.annotation) if a is not type(None)]
    literal = args[0] if len(args) == 1 else field.annotation
    if typing.get_origin(literal) is typing.Literal:
        return list(typing.get_args(literal))
    return None


def default_text(field: FieldInfo) -> str | None:
    """The default as --help writes it; None where there is none to show (unset, off, empty)."""
    declared = meta(field)
    if declared.get("default_text"):
        return str(declared["default_text"])
    default = field.get_default(call_default_factory=True)
    if default is None or default is False or default in ({}, []):
        return None
    if declared.get("metavar") == "DURATION":
        return format_duration(default)
    return f"{default:g}" if isinstance(default, float) else str(default)
