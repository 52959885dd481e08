"""`autoloop verify`: which kept changes really matter, and do they hold at scale."""

from __future__ import annotations

import argparse
import json
import sys

from autoloop.cli.flags import settings_from
from autoloop.cli.paths import repo_root


def run(args: argparse.Namespace) -> int:
    from autoloop.engine.opening import open_night
    from autoloop.observe.console import Console
    from autoloop.verification.verify import run_verification
    from autoloop.verification.verify_plan import summary_lines

    settings = settings_from(args)   # --resume too: open_night recovers a killed verification first
    console = Console(sys.stderr) if args.json else Console()   # --json: stdout holds the JSON alone
    with open_night(settings, repo_root(args.directory), console, "verify") as night:
        summary = run_verification(night, settings, resume=args.resume)
    for line in summary_lines(summary):
        console.line(line)
    if args.json:
        from autoloop.review.json_forms import verify_payload

        print(json.dumps(verify_payload(summary), indent=2))
    return night.stop.exit_status()
