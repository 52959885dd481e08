"""Settings: pydantic models, loaded from [tool.autoloop] / autoloop.toml, then CLI overrides.

INTERFACE STUB - to be implemented (issue 4).
"""

from __future__ import annotations

from pathlib import Path


class ConfigError(Exception):
    """A bad setting; the message is one line for the user."""


def parse_duration(text) -> float:
    """'300', '300s', '5m', '1h30m', 90 -> seconds."""
    raise NotImplementedError


def load_settings(workdir: Path, overrides: dict | None = None):
    """Settings from the workspace's config files, with non-None overrides applied on top."""
    raise NotImplementedError
