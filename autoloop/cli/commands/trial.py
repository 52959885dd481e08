"""`autoloop trial`: the edit already in the work tree judged as one trial (for agents that drive themselves)."""

from __future__ import annotations

import argparse

from autoloop.cli.flags import settings_from
from autoloop.cli.paths import repo_root


def run(args: argparse.Namespace) -> int:
    from autoloop.engine.attempt import AttemptRunner
    from autoloop.engine.opening import open_night
    from autoloop.engine.slot import Slot
    from autoloop.engine.trial import judge_edit
    from autoloop.observe.console import Console

    settings = settings_from(args)
    with open_night(settings, repo_root(args.directory), Console(), "trial") as night:
        record = judge_edit(night, AttemptRunner(night, Slot.main(night)), args.message)
    # The last line is for the agent that called us: verdict and metric, easy to parse.
    metric = "-" if record.metric is None else f"{record.metric:.6f}"
    crash = f" {record.crash}" if record.crash else ""
    print(f"verdict: {record.status}{crash} {settings.metric}: {metric} reason: {record.reason}")
    return night.stop.exit_status() or (0 if record.status != "crash" else 3)
