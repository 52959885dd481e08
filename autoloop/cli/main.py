"""Command line: the parser, the exit codes, and the dispatch to autoloop/cli/commands/<name>.py."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from autoloop import __version__
from autoloop.cli.flags import settings_from
from autoloop.cli.paths import shown_path

# settings_from stays importable from here: tests/test_flags.py and test_agent.py read flags through it.
__all__ = ["build_parser", "main", "settings_from"]

if TYPE_CHECKING:   # what add_subparsers returns: private in argparse, generic only in typeshed
    from typing import TypeAlias

    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

EXIT_USAGE = 2
EXIT_INTERNAL = 70   # EX_SOFTWARE of sysexits.h: a bug of ours


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got '{text}'") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got '{text}'") from None
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected 0.1 to 3600 seconds, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autoloop",
        description="Autonomous experiment loop: propose one change to train.py, train for a fixed "
                    "budget, keep it if val_bpb improved, else reset. Every attempt is recorded.",
    )
    parser.add_argument("--version", action="version", version=f"autoloop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # One function per subcommand, in the order --help lists them.
    for add in (_add_prepare, _add_run, _add_trial, _add_verify, _add_ladder, _add_doctor, _add_status,
                _add_attempts, _add_history, _add_report, _add_note, _add_finalize, _add_dashboard, _add_watch,
                _add_mcp, _add_init):
        add(sub)
    # Which module runs it: not args.command, which run's --command (the trial's command line)
    # overwrites with its own default.
    for name, command_parser in sub.choices.items():
        command_parser.set_defaults(subcommand=name)
    return parser


def _directory_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-C", "--directory", default=".", help="the experiment repository (default: here)")


def _add_prepare(sub: Subparsers) -> None:
    from autoloop.data import DEFAULT_AUDIT_BYTES, DEFAULT_VAL_BYTES

    p = sub.add_parser(
        "prepare", help="build the train/val/audit split of a corpus (idempotent)",
        description="Build the pinned train/validation/audit split of a corpus into a data directory "
                    "and print its size and fingerprint. Running it again on the same corpus changes "
                    "nothing. train.py prepares the default corpus by itself on first use.",
    )
    p.add_argument("--corpus", default="stdlib", metavar="SOURCE",
                   help="'stdlib' (default: this Python's standard-library sources), 'climbmix' (a public "
                        "web-text corpus of GPU size, downloaded from the Hugging Face hub; needs the hub "
                        "extra) or a directory, file or glob of text files")
    p.add_argument("--shards", type=_positive_int, default=None, metavar="N",
                   help="with a named corpus: how many of its shards to download (climbmix: 4, about 1 GB "
                        "of text)")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="where to write the prepared data (default: $AUTOLOOP_DATA_DIR, else a "
                        "per-user cache folder named after the corpus)")
    p.add_argument("--val-bytes", type=_positive_int, default=DEFAULT_VAL_BYTES, metavar="N",
                   help=f"size of the pinned validation slice (default {DEFAULT_VAL_BYTES:,})")
    p.add_argument("--audit-bytes", type=_positive_int, default=DEFAULT_AUDIT_BYTES, metavar="N",
                   help=f"size of the held-out audit slice (default {DEFAULT_AUDIT_BYTES:,})")


def _add_run(sub: Subparsers) -> None:
    from autoloop.cli.flags import add_setting_flags

    p = sub.add_parser(
        "run", help="run the experiment loop (the main job)",
        description="Ask the proposer for one change to the target, commit it, train for the budget, keep "
                    "the commit if the metric improved, else reset; record every attempt in "
                    "results/ledger.jsonl and results/results.tsv. The first trial is the baseline of the "
                    "unmodified target. Ctrl-C stops cleanly; after a crash or kill, --resume continues.",
        epilog="Exit status: 0 when the run stopped by itself (--hours, --max-trials, no more ideas); "
               "130 after SIGINT (Ctrl-C) and 143 after SIGTERM, the running trial ended and recorded; "
               "1 for an error (one line on stderr), 2 for bad usage, 70 for an internal error. "
               "Every flag can also be set in [tool.autoloop] of pyproject.toml or in autoloop.toml "
               "(the flag's name, with - or _); flags win over the file. "
               "Example: autoloop run --budget 5m --hours 8",
    )
    add_setting_flags(p, "run")
    _directory_flag(p)


def _add_trial(sub: Subparsers) -> None:
    from autoloop.cli.flags import add_setting_flags

    p = sub.add_parser(
        "trial", help="judge the current edit of the target as one trial (for agents that drive themselves)",
        description="Commit the current edit of the target, train it, keep or reset it, record it, and print "
                    "the verdict as the last line: 'verdict: keep|discard|crash [class] val_bpb: X reason: ...'. "
                    "Exit code 0 for keep/discard, 3 for a crash, 130/143 when stopped by SIGINT/SIGTERM. "
                    "The first call on a branch runs the baseline "
                    "of the unmodified target first.",
    )
    p.add_argument("-m", "--message", required=True, help="one line: what this change tries")
    add_setting_flags(p, "trial")
    _directory_flag(p)


def _add_verify(sub: Subparsers) -> None:
    from autoloop.cli.flags import add_setting_flags

    p = sub.add_parser(
        "verify", help="the morning verdict: which kept changes really matter, and do they hold at scale",
        description="Run the best, the baseline and the best with each kept change taken out (its diff reverted "
                    "on the best) --repeats times each with new seeds, and give each change its contribution "
                    "with a 95% interval: confirmed, within noise, or harmful. With --scale KEY=VALUE and/or "
                    "--scale-budget, run the baseline, the best and the best without each confirmed change again "
                    "at that scale: does the gain hold. Every run is an attempt of kind 'verify' in the ledger; "
                    "none moves the best, and the branch and work tree end as they started. After a kill, "
                    "--resume recovers and runs what is left, nothing twice. The runs train with the settings "
                    "of the night (autoloop.toml / pyproject.toml and the flags below: give the --budget the "
                    "night had).",
        epilog="example: autoloop verify --budget 5m --repeats 3 --scale DEPTH=6 --scale-budget 15m")
    add_setting_flags(p, "run", sections=("trial", "safety", "slurm", "verify"))
    p.add_argument("--tag", metavar="TAG", help="which night (default: the tag of results/, else the checked-out "
                                                "autoloop/TAG branch)")
    p.add_argument("--resume", action="store_true",
                   help="recover a killed verification and run the repeats it has not recorded yet")
    p.add_argument("--json", action="store_true",
                   help="print the verdict as JSON at the end (schema autoloop.verify, docs/agents.md); "
                        "the progress lines go to stderr")
    _directory_flag(p)


def _add_doctor(sub: Subparsers) -> None:
    from autoloop.cli.flags import add_setting_flags

    p = sub.add_parser(
        "doctor", help="check that this repository and machine are ready for a night (one line per check)",
        description="Check git and its identity, a clean tree, the target's contract, the data, torch and the "
                    "device (GPU name, free memory), free disk, the configured agent (its preflight: executable, "
                    "version, login or API key), the optional extras and --isolate. One line each: ok, warn or "
                    "fail. Exit code 1 when any check fails. Settings come from autoloop.toml / pyproject.toml "
                    "and the flags below, the same as autoloop run takes; nothing trains and nothing reaches "
                    "the network (unless --notify-test sends one notification to each --notify URL).",
        epilog="example: autoloop doctor --agent claude",
    )
    add_setting_flags(p, "run")
    p.add_argument("--notify-test", action="store_true",
                   help="send one test notification to each --notify URL (otherwise only their form is checked)")
    _directory_flag(p)


def _add_status(sub: Subparsers) -> None:
    p = sub.add_parser("status", help="where the loop stands (safe while it runs)",
                       description="Current trial and phase, best and baseline metric, counts by status and "
                                   "crash class, pace and time left. Reads results/ only.")
    p.add_argument("--json", action="store_true",
                   help="machine-readable output (schema autoloop.status, docs/agents.md)")
    _directory_flag(p)


def _add_attempts(sub: Subparsers) -> None:
    p = sub.add_parser("attempts", help="the night's attempts, filtered: a table or JSON (safe while it runs)",
                       description="The attempts of results.tsv (skips too with --status skip), oldest first, "
                                   "with their metric, delta against the best they were judged on, commit and "
                                   "description. Reads results/ only. The JSON is the MCP tool's answer "
                                   "(schema autoloop.attempts, docs/agents.md).",
                       epilog="example: autoloop attempts --since 40 --status crash --json")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--status", action="append", metavar="STATUS",
                   help="keep, discard, crash or skip (repeat the flag or give a comma list)")
    p.add_argument("--crash", action="append", metavar="CLASS",
                   help="trivial, fundamental or timeout (repeat the flag or give a comma list)")
    p.add_argument("--since", type=int, metavar="N", help="only the trials after trial N")
    p.add_argument("--kept", action="store_true", help="only the kept attempts")
    p.add_argument("--limit", type=_positive_int, metavar="N", help="only the last N rows")
    _directory_flag(p)


def _add_history(sub: Subparsers) -> None:
    p = sub.add_parser("history", help="the study: every night of this workspace, its best and the running best",
                       description="Every night of this workspace (archived under results/archive/ or live), "
                                   "oldest first: dates, baseline, best, gain, kept changes, verify runs, "
                                   "device-hours, budget and machine, and the running best of the study across the "
                                   "nights comparable with the newest (same budget, corpus, metric and machine). "
                                   "Reads results/ only (schema autoloop.history with --json).",
                       epilog="example: autoloop history --json")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _directory_flag(p)


def _add_report(sub: Subparsers) -> None:
    p = sub.add_parser("report", help="write the morning summary: results/report.md and results/progress.png",
                       description="Baseline vs best, the kept changes with their deltas, crashes by class with "
                                   "their reasons, the noise estimate and where the wall time went, in report.md; "
                                   "the metric per attempt in progress.png (needs matplotlib: "
                                   "pip install autoloop[plot]). Reads results/ only; safe while the loop runs.")
    p.add_argument("--output", metavar="DIR", help="where to write report.md and progress.png (default results/)")
    p.add_argument("--since-last", action="store_true",
                   help="print only the results.tsv rows added since the previous report, each kept change "
                        "with its code diff (writes no files)")
    _directory_flag(p)


def _add_note(sub: Subparsers) -> None:
    p = sub.add_parser("note", help="tell the agent something: a note every later prompt carries "
                                    "(safe while the loop runs)",
                       description="Add a timestamped note that every later agent prompt carries, in the research "
                                   "digest, until autoloop note --clear; without arguments, list the notes in force. "
                                   "Safe from another shell while the loop runs: the next proposal reads it. Notes "
                                   "and clears are kept in results/person-notes.json and listed in the report.",
                       epilog='example: autoloop note "try SwiGLU; leave the learning rates alone"')
    p.add_argument("text", nargs="*", metavar="TEXT", help="the note (one line; quote it)")
    p.add_argument("--clear", action="store_true",
                   help="drop the notes in force, pinned lessons aside (the report still lists them)")
    p.add_argument("--pin", action="store_true",
                   help="a lesson for every later night of the study: --clear keeps it, --unpin drops it")
    p.add_argument("--unpin", action="store_true", help="drop the pinned lessons")
    _directory_flag(p)


def _add_ladder(sub: Subparsers) -> None:
    from autoloop.cli.flags import add_setting_flags

    p = sub.add_parser(
        "ladder", help="a scaling ladder: does a kept change's gain hold, shrink or flip as the model grows",
        description="Run the best's kept change (or --change TRIAL) and its parent at each rung of a scale path, "
                    "smallest first, --seeds paired seeds each, interleaved: the rungs from train.py's DEPTH and "
                    "WIDTH (parameters doubled per rung) or given with --rung. The largest rung is held out: a "
                    "weighted fit of the change's gain against log-compute on the others must predict it, else "
                    "the ladder is 'not predictive' and nothing is extrapolated. Verdicts: HOLDS, SHRINKING, "
                    "SCALE-BOUND, NOISE, or RETUNE-AT-SCALE for a change that only moves a learning rate, weight "
                    "decay, batch or schedule constant (its multiplier swept over 1/4..4 per rung). Every run is an "
                    "attempt of kind 'verify'; the branch and work tree end as they started; --resume after a kill.",
        epilog="example: autoloop ladder --budget 5m --rung DEPTH=2,WIDTH=64 --rung DEPTH=3,WIDTH=128 "
               "--rung DEPTH=4,WIDTH=192 --rung DEPTH=6,WIDTH=256")
    add_setting_flags(p, "run", sections=("trial", "safety", "slurm"))
    p.add_argument("--change", type=int, metavar="TRIAL", help="the kept change to put on the ladder (default: the "
                                                                  "one whose commit is the best)")
    p.add_argument("--rung", action="append", metavar="KEY=VALUE[,KEY=VALUE]",
                   help="one rung: the constants it sets (budget=DURATION sets its budget); repeat, at least 3; "
                        "default: from DEPTH and WIDTH")
    p.add_argument("--rungs", type=_positive_int, default=4, metavar="N",
                   help="how many rungs to derive from DEPTH and WIDTH (default 4: three to fit, one held out)")
    p.add_argument("--seeds", type=_positive_int, default=3, metavar="K",
                   help="paired seeds per side and rung (default 3)")
    p.add_argument("--budget-mode", choices=("fixed", "scaled"), default="fixed",
                   help="fixed: every rung trains for --budget (default); scaled: --budget x (N/N1)^2, so that "
                        "the tokens grow with the parameters")
    p.add_argument("--target-params", type=float, metavar="N",
                   help="for a tuning change: the size to give the constant's value at (default: the largest rung; "
                        "never beyond 30x the largest rung's parameters)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON document (progress on stderr)")
    p.add_argument("--tag", metavar="TAG", help="which night (default: the tag of results/, else the checked-out "
                                                "autoloop/TAG branch)")
    p.add_argument("--resume", action="store_true",
                   help="recover a killed ladder and run the runs it has not recorded yet")
    _directory_flag(p)


def _add_finalize(sub: Subparsers) -> None:
    p = sub.add_parser("finalize", help="the kept changes as a clean branch: one commit each, metrics in the messages",
                       description="Create a new branch (default autoloop/<tag>-final) from the baseline commit "
                                   "with one commit per kept change, in ledger order, each message giving the "
                                   "description and the metric before and after, then one commit adding "
                                   "results/results.tsv, report.md and progress.png (forced past .gitignore "
                                   "on that branch only). Uses git plumbing only: the work tree, the index, "
                                   "HEAD and the loop's branch are left as they are.")
    p.add_argument("--tag", metavar="TAG", help="which night (default: the tag of results/, else the checked-out "
                                                "autoloop/TAG branch)")
    p.add_argument("--branch", metavar="NAME", help="name of the new branch (default autoloop/<tag>-final); "
                                                    "refused if it exists")
    p.add_argument("--squash-overlapping", action="store_true",
                   help="one commit for consecutive kept changes that touch overlapping lines")
    p.add_argument("--no-results", action="store_true",
                   help="leave out the last commit, which adds results/results.tsv, report.md and progress.png")
    p.add_argument("--drop-unproven", action="store_true",
                   help="leave out the kept changes that autoloop verify did not confirm (contribution within "
                        "noise, or harmful); needs a finished autoloop verify of the best")
    p.add_argument("--push", nargs="?", const="", default=None, metavar="REMOTE",
                   help="push the new branch to REMOTE (default origin, else the only remote); never the loop's "
                        "branch, never with force unless --force")
    p.add_argument("--force", action="store_true",
                   help="with --push: replace the remote branch of that name (git push --force-with-lease)")
    p.add_argument("--pr", action="store_true",
                   help="push, then open a pull request with the GitHub CLI (gh, logged in): its body the report's "
                        "summary, the kept changes with their verified contributions and the results.tsv diff")
    _directory_flag(p)


def _add_dashboard(sub: Subparsers) -> None:
    from autoloop.review.dashboard.server import DEFAULT_PORT, TOKEN_ENV

    p = sub.add_parser("dashboard", help="a live, read-only web page of the night (safe while the loop runs)",
                       description="Serve a web page that shows the night as it runs and afterwards: the metric per "
                                   "attempt with the running best and crashes by class, the sortable table of every "
                                   "attempt, each attempt's description, reason, diff and log, the trial in flight "
                                   "with its live log, noise, pace and time left. Everything it needs ships with "
                                   "autoloop (no internet). It only reads results/ and git; it writes nothing.",
                       epilog=f"On 127.0.0.1 (the default) only this machine is served. With --host 0.0.0.0 (to "
                              f"look from a phone on the same network) a token is printed in the URL and "
                              f"checked on every request; set {TOKEN_ENV} to keep the same one across restarts.")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, metavar="N",
                   help=f"port to listen on (default {DEFAULT_PORT}; 0: any free one)")
    p.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every "
                        "interface, with a token)")
    _directory_flag(p)


def _add_mcp(sub: Subparsers) -> None:
    p = sub.add_parser("mcp", help="an MCP server of the night for a coding agent (stdio; safe while it runs)",
                       description="Serve the night over the Model Context Protocol on stdin/stdout: the tools "
                                   "status, attempts, attempt, best, digest, report and verify_status read "
                                   "results/ and git; note, queue_patch and stop_after_trial steer the night and "
                                   "answer only with --allow-write. Resources: results.tsv, program.md, the "
                                   "report. Needs pip install 'autoloop[mcp]'. With --install, write a client's "
                                   "configuration for this repository instead (docs/agents.md).",
                       epilog="example: autoloop mcp --install claude --install codex")
    p.add_argument("--allow-write", action="store_true",
                   help="let the client add notes, queue patches and stop the night after its trial")
    p.add_argument("--install", action="append", choices=("claude", "codex", "gemini"), metavar="CLIENT",
                   help="write CLIENT's MCP configuration (claude, codex or gemini; repeat for several) and exit")
    _directory_flag(p)


def _add_watch(sub: Subparsers) -> None:
    p = sub.add_parser("watch", help="the night, live, in this terminal (read-only; q or Ctrl-C quits)",
                       description="Show the night in the terminal, redrawn every few seconds: the summary (best, "
                                   "baseline, pace, time left), each attempt in flight with its progress and loss "
                                   "(every worker's), the running best as a small plot, and the last attempts. "
                                   "For a shell without a browser (SSH). It reads results/ only, like the "
                                   "dashboard: no lock, nothing written; quitting leaves the night running.",
                       epilog="Needs rich: pip install 'autoloop[watch]'.")
    p.add_argument("--interval", type=_seconds, default=2.0, metavar="S",
                   help="seconds between two frames (default 2)")
    p.add_argument("--last", type=_positive_int, default=10, metavar="N",
                   help="how many of the last attempts to list (default 10)")
    p.add_argument("--once", action="store_true",
                   help="print one frame and exit (no terminal needed: for scripts and pipes)")
    _directory_flag(p)


def _add_init(sub: Subparsers) -> None:
    p = sub.add_parser("init", help="create a fresh experiment repository",
                       description="Create DIR with train.py, program.md, .gitignore and a first commit, "
                                   "ready for autoloop run.")
    p.add_argument("path", metavar="DIR", help="folder to create (must not exist or be empty)")
    p.add_argument("--install", action="append", choices=("claude", "codex", "gemini"), metavar="CLIENT",
                   help="also write CLIENT's MCP configuration and skill (claude, codex or gemini; repeat for "
                        "several), committed with the rest")


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:   # Ctrl-C before a command's own handling: in the imports, the parser
        print("autoloop: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    from autoloop.core.errors import AutoloopError

    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "subcommand", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return _run_command(args)
    except AutoloopError as e:   # every error meant for the user (errors.py)
        print(f"autoloop: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        print("autoloop: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours: one line, the traceback in a log file
        if os.environ.get("AUTOLOOP_DEBUG"):
            raise
        from autoloop.cli.disk_error import disk_error_line

        line = disk_error_line(e)   # unless the disk refused a write: the machine's trouble
        if line is not None:
            print(line, file=sys.stderr)
            return 1
        return _internal_error(e, argv, getattr(args, "directory", "."))


def _run_command(args: argparse.Namespace) -> int:
    """The command's module (autoloop/cli/commands/), imported only when it runs: GitPython or
    doctor's checks cost a tenth of a second that `autoloop status` need not pay."""
    module = importlib.import_module(f"autoloop.cli.commands.{args.subcommand}")
    status: int = module.run(args)
    return status


def _internal_error(error: Exception, argv: list[str], directory: str) -> int:
    """One line on stderr naming the log that holds the traceback and the versions."""
    from autoloop.cli.internal_error import write_log

    what = f"autoloop: internal error: {type(error).__name__}: {error}"
    try:
        log = write_log(error, argv, directory)
    except Exception:  # writing the log failed too: the traceback goes to stderr
        log = None
    if log is None:
        traceback.print_exception(error)
        print(f"{what} (traceback above; please include it in a bug report; recorded results are safe, "
              "autoloop run --resume recovers an interrupted trial)", file=sys.stderr)
    else:
        print(f"{what} (traceback in {shown_path(log, Path.cwd())}; please attach it to a bug report; "
              "recorded results are safe, autoloop run --resume recovers an interrupted trial)", file=sys.stderr)
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
