"""The command-line flags of `autoloop run` and `autoloop trial`, generated from the settings.

Every setting is declared once, as a field of :class:`autoloop.config.settings.Settings` (its
default, its checks, its help text and its section). This module turns those fields into
argparse flags, one argument group per section, and the parsed flags back into the
overrides ``load_settings`` takes. A flag's value is passed on as the user typed it: the
field validates it, so a bad value reads the same from a flag as from a config file
(``--budget: cannot read '5 minutes' as a duration``), one line, no usage dump.
"""

from __future__ import annotations

import argparse
import typing
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from autoloop.config.fields import choices, default_text, meta
from autoloop.config.loading import load_settings
from autoloop.config.settings import SECTIONS, Settings, flag_of


def add_setting_flags(parser: argparse.ArgumentParser, command: str, sections: tuple[str, ...] | None = None) -> None:
    """One argument group per section, with the flag of every setting `command` takes;
    ``sections``: only these (`autoloop verify` takes how a trial runs, not the night's search)."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for section, title in SECTIONS.items():
        if sections is not None and section not in sections:
            continue
        fields = [(n, f) for n, f in Settings.model_fields.items() if meta(f)["section"] == section
                  and (command == "run" or not meta(f)["run_only"])]
        if fields:
            groups[section] = parser.add_argument_group(title)
        for name, field in fields:
            _add(groups[section], name, field)


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the flags gave (None: not given), as load_settings takes them."""
    out: dict[str, Any] = {}
    for name, field in Settings.model_fields.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        if _origin(field.annotation) is dict:
            value = dict(value)   # [(key, value)] from a repeatable KEY=VALUE flag
        out[name] = value
    return out


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings from the workspace's config file, with the flags given on top."""
    return load_settings(Path(args.directory).resolve(), overrides_from(args))


# ------------------------------------------------------------------------------ one flag




def _origin(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    inner = args[0] if len(args) == 1 and typing.get_origin(annotation) is not dict else annotation
    return typing.get_origin(inner) or inner






def _help(field: FieldInfo) -> str:
    text, default = field.description or "", default_text(field)
    if "{default}" in text:
        text = text.replace("{default}", default or "none")
    elif default is not None:
        text += f" (default {default})"
    return text.replace("%", "%%")   # argparse formats help with %


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _add(group: argparse._ArgumentGroup, name: str, field: FieldInfo) -> None:
    kwargs: dict[str, Any] = {"dest": name, "default": None, "help": _help(field)}
    if field.annotation is bool:
        kwargs["action"] = argparse.BooleanOptionalAction   # --isolate / --no-isolate over the file
    elif _origin(field.annotation) is dict:
        kwargs.update(action="append", type=_key_value, metavar=meta(field).get("metavar"))
    elif meta(field).get("repeatable"):
        # --track wandb --track mlflow, or --track wandb,mlflow: the validator splits and checks
        kwargs.update(action="append", metavar=meta(field).get("metavar"))
    else:
        accepted = choices(field)
        if accepted:
            kwargs["choices"] = accepted
        else:
            kwargs["metavar"] = meta(field).get("metavar")
    group.add_argument(flag_of(name), **kwargs)
