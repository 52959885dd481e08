"""`autoloop ladder`: does a kept change's gain hold, shrink or flip as the model grows."""

from __future__ import annotations

import argparse
import sys

from autoloop.cli.flags import settings_from
from autoloop.cli.paths import repo_root


def run(args: argparse.Namespace) -> int:
    from autoloop.engine.opening import open_night
    from autoloop.observe.console import Console
    from autoloop.verification.ladder import LadderOptions, run_ladder
    from autoloop.verification.ladder_plan import summary_json, summary_lines

    settings = settings_from(args)   # --resume too: open_night recovers a killed ladder first
    options = LadderOptions(change=args.change, rungs=args.rung or [], count=args.rungs, seeds=args.seeds,
                            budget_mode=args.budget_mode, target_params=args.target_params)
    # With --json the progress goes to stderr, so that stdout is the one JSON document.
    console = Console(sys.stderr if args.json else None)
    with open_night(settings, repo_root(args.directory), console, "verify") as night:
        summary = run_ladder(night, settings, options, resume=args.resume)
    if args.json:
        print(summary_json(summary))
    else:
        for line in summary_lines(summary):
            console.line(line)
    return night.stop.exit_status()
