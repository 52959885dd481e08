"""`autoloop run`: the experiment loop, the main job."""

from __future__ import annotations

import argparse

from autoloop.cli.flags import settings_from
from autoloop.cli.paths import repo_root


def run(args: argparse.Namespace) -> int:
    from autoloop.engine.opening import open_night
    from autoloop.engine.scheduler import Scheduler
    from autoloop.observe.console import Console
    from autoloop.proposers.choose import make_proposer

    settings = settings_from(args)
    console = Console()
    root = repo_root(args.directory)
    proposer, why = make_proposer(settings, root)
    console.line(why)
    with open_night(settings, root, console, "run") as night:
        Scheduler(night, proposer).run()
        if settings.verify_at_end and not night.stop.is_set():
            from autoloop.verification.verify import verify_at_end

            verify_at_end(night, settings)
    return night.stop.exit_status()
