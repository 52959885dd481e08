"""`autoloop doctor`: is this repository and this machine ready for a night? One line per
check as it is done (the checks: review/doctor.py); exit 1 when one fails."""

from __future__ import annotations

import argparse

from autoloop.cli.flags import settings_from
from autoloop.cli.paths import repo_root


def run(args: argparse.Namespace) -> int:
    from autoloop.review.doctor import run_doctor

    checks = run_doctor(repo_root(args.directory), lambda: settings_from(args), print, notify_test=args.notify_test)
    return 1 if any(c.status == "fail" for c in checks) else 0
