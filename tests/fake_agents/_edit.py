"""Shared by the fake agents: edit train.py's constants like an agent would."""

import os
import re
from pathlib import Path


def values_from(args: list[str]) -> dict[str, str]:
    """The NAME=VALUE arguments: the constants to set (the tests pass train.py's own
    learning rates, which the starting copy has made tiny)."""
    return dict(arg.split("=", 1) for arg in args if "=" in arg and arg.split("=", 1)[0].isupper())


def set_constants(path: Path, values: dict[str, str]) -> None:
    assert values, "no NAME=VALUE arguments given"
    text = path.read_text()
    for name, value in values.items():
        text, n = re.subn(rf"^{name} = [^#\n]*", f"{name} = {value} ", text, count=1, flags=re.M)
        assert n == 1, name
    path.write_text(text)


def scale_constants(path: Path, values: dict[str, str], factor: float) -> None:
    """Set each constant to its given value times ``factor``: a new change every trial."""
    set_constants(path, {name: str(float(value) * factor) for name, value in values.items()})


def describe(line: str) -> None:
    Path(os.environ["AUTOLOOP_DESCRIPTION_FILE"]).write_text(line + "\n")
