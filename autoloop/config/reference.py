"""docs/configuration.md, generated from the settings' one declaration.

Every setting is a field of :class:`autoloop.config.settings.Settings` made with ``setting()``:
its default, its section, its help text, its flag. The reference page is written from those
fields, the way autoloop.cli.flags writes the flags from them, so the page cannot name a key,
a flag or a default the code does not have (tests/test_docs.py compares the file with
:func:`configuration_markdown`).

    python -m autoloop.config.reference > docs/configuration.md
"""

from __future__ import annotations

import sys

from pydantic.fields import FieldInfo

from autoloop.config import fields
from autoloop.config.fields import default_text, meta
from autoloop.config.loading import AUTOLOOP_TOML, PYPROJECT
from autoloop.config.settings import SECTIONS, Settings, flag_of
from autoloop.core.durations import format_duration

REGENERATE = "python -m autoloop.config.reference > docs/configuration.md"

# A night's settings as a person would write them; the page shows it whole, and
# tests/test_docs.py loads it through the settings so that it stays valid.
EXAMPLE_TOML = """\
[tool.autoloop]
budget = "5m"          # training time per trial: 300, "300s", "5m", "1h30m"
timeout = "12m"        # hard limit per trial (default max(2 x budget, budget + 2m))
hours = 8              # no trial starts that could not finish in time
max-trials = 100       # trials of this run, skipped proposals included
proposer = "auto"      # auto | agent | queue | mutate | optuna | portfolio (see docs/proposers.md)
sampler = "tpe"        # optuna's sampler: tpe | cmaes | gp
# portfolio = ["agent", "optuna", "mutate"]   # the proposers sharing the night (implies proposer = "portfolio")
agent = "claude"       # preset: claude | codex | aider | gemini
# agent-cmd = "my-agent --prompt-file {prompt_file}"   # any other agent (wins over `agent`)
agent-timeout = "15m"  # per agent call; its whole process tree is killed after
agent-stall-timeout = "90s"   # end a call whose CLI only keeps retrying its API this long; 0: off
skip-preflight = false # true: start without the agent's preflight checks
max-fix-attempts = 2   # fix requests for a trivially-crashed trial (0: none)
max-agent-failures = 5 # agent failures in a row before the loop stops
# max-agent-cost = 20.0  # US dollars of agent calls (as their CLIs report it) before the night stops
digest-kb = 8          # the research digest in each agent prompt holds at most this many kB
lookahead = 1          # propose the next trial while this one trains (default: 1 for an agent, 0 otherwise)
target = "train.py"    # the one file a proposer may edit
command = "uv run train.py"   # for an autoresearch checkout; default: this Python on the target
metric = "val_bpb"     # parsed as `val_bpb: <number>` from stdout when no result file is written
direction = "min"
min-delta = 0.0        # a keep must beat the best by more than this
noise-runs = 2         # extra runs of the baseline (seeds seed+1, seed+2) to estimate the noise; 0: off
keep-rule = "auto"     # noise | strict; auto: noise once a noise estimate exists, else strict
noise-z = 2.0          # the noise rule keeps a gain > max(min-delta, noise-z x sigma)
remeasure = false      # `autoloop run --remeasure`: re-run the best noise-runs times first
seed = 42
max-rss-gb = 16        # kill a trial whose process tree grows past this
corpus = "stdlib"      # or a directory / file / glob of text
device = "cuda"        # default: auto-detect
track = ["wandb"]      # also log every attempt to wandb and/or mlflow (see docs/watching.md)
"""


def configuration_markdown() -> str:
    """The whole page: how settings are found, an example, then one table per section."""
    parts = [_intro(), _example()]
    for section, title in SECTIONS.items():
        names = [name for name, field in Settings.model_fields.items() if meta(field)["section"] == section]
        if names:
            parts.append(_section(title, names))
    return "\n".join(parts)


# ------------------------------------------------------------------------------ the page


def _intro() -> str:
    return f"""\
<!-- Generated from autoloop/config/settings.py; do not edit. Regenerate: {REGENERATE} -->
# Configuration

Every setting of `autoloop run` has a key for a config file and a flag; both come from one
declaration in `autoloop/config/settings.py`, and so does this page.

Where a setting comes from, lowest priority first:

1. its default (the tables below);
2. ONE config file in the experiment repository's directory (the one `-C` names; default: where
   autoloop runs): either `{AUTOLOOP_TOML}`, settings as top-level keys, or the `[tool.autoloop]`
   table of `{PYPROJECT}`. When both define settings, autoloop refuses to start (`settings in
   both {AUTOLOOP_TOML} and {PYPROJECT} [tool.autoloop]; keep them in one`): silently preferring
   one would leave you editing the one that is ignored. An empty `{AUTOLOOP_TOML}`, or a
   `{PYPROJECT}` without `[tool.autoloop]`, defines none;
3. the flags: a flag given overrides the file (an on/off setting has a `--no-` flag too:
   `--no-isolate` for one run of a night whose file says `isolate = true`).
   `--slurm-option KEY=VALUE` adds to the file's `slurm_options` table instead of replacing it.

A key may be written with `-` for `_` (`max-trials = 100`), not both ways at once. Durations
take a number of seconds or a string: `300`, `"300s"`, `"5m"`, `"1h30m"`. Unknown keys and bad
values are refused with one line naming the key and where it came from, the same from a flag
as from the file (`--workers: must be at least 1, got 0`, `autoloop.toml: unknown setting
'bugdet' (did you mean 'budget'?)`).

`autoloop run` and `autoloop doctor` take every flag below; `autoloop trial` takes those not
marked *(run)*; `autoloop verify` takes those of one trial, safety, where trials run and
verification. `autoloop COMMAND --help` lists them with the same text.
"""


def _example() -> str:
    return f"""\
## Example

In `{PYPROJECT}` (in `{AUTOLOOP_TOML}`, the same lines without `[tool.autoloop]`):

```toml
{EXAMPLE_TOML}```
"""


def _section(title: str, names: list[str]) -> str:
    lines = [f"## {title[0].upper()}{title[1:]}", "", "| TOML key | flag | default | meaning |", "|---|---|---|---|"]
    for name in names:
        field = Settings.model_fields[name]
        cells = [f"`{name}`", _flag_cell(name, field), _default_cell(field), _escape(_meaning(field))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ one row






def _flag_cell(name: str, field: FieldInfo) -> str:
    flag = flag_of(name)
    if field.annotation is bool:
        text = f"`{flag}`, `--no-{flag[2:]}`"
    else:
        choices = [str(c) for c in fields.choices(field) or []]
        value = "\\|".join(choices) if choices else _escape(str(meta(field).get("metavar") or "VALUE"))
        text = f"`{flag} {value}`"
    repeatable = meta(field).get("repeatable") or isinstance(field.get_default(call_default_factory=True), dict)
    if repeatable and "repeat" not in (field.description or ""):
        text += " (repeatable)"
    return text + (" *(run)*" if meta(field).get("run_only") else "")


def _default_cell(field: FieldInfo) -> str:
    """The default as it would be written in the file, or in words where it depends on others."""
    declared = meta(field)
    if declared.get("default_text"):
        return _escape(declared["default_text"])
    default = field.get_default(call_default_factory=True)
    if default is None:
        return "not set"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if declared.get("metavar") == "DURATION":
        return f'`"{format_duration(default)}"`'
    if isinstance(default, str):
        return f'`"{default}"`'
    if isinstance(default, float):
        return f"`{default:g}`"
    return f"`{default}`"


def _meaning(field: FieldInfo) -> str:
    """The --help text, its {default} filled in as the flag's help fills it."""
    text = field.description or ""
    return text.replace("{default}", (default_text(field) or "none")) if "{default}" in text else text




def _escape(text: str) -> str:
    """Table-cell text: a pipe would end the cell, an asterisk start emphasis."""
    return text.replace("|", "\\|").replace("*", "\\*")


if __name__ == "__main__":
    sys.stdout.write(configuration_markdown())
