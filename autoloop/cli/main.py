"""Command line: argument parsing, sub-commands and exit codes; the logic lives elsewhere."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from autoloop import __version__

EXIT_USAGE = 2


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def cmd_prepare(args) -> int:
    from autoloop.data import CorpusSpec, prepare

    spec = CorpusSpec(source=args.corpus, val_bytes=args.val_bytes, audit_bytes=args.audit_bytes)
    info = prepare(spec, args.data_dir)
    for line in info.summary_lines():
        print(line)
    if args.data_dir is None and not spec.is_stdlib:
        print(f"use it with: export AUTOLOOP_DATA_DIR={info.data_dir}")
    return 0


def settings_from(args):
    """Settings from the workspace's config file, with the flags given on top."""
    from autoloop.cli.flags import overrides_from
    from autoloop.config.settings import load_settings

    return load_settings(Path(args.directory).resolve(), overrides_from(args))


def cmd_run(args) -> int:
    from autoloop.engine.night import open_night
    from autoloop.engine.scheduler import Scheduler
    from autoloop.observe.console import Console
    from autoloop.proposers import make_proposer

    settings = settings_from(args)
    console = Console()
    root = _repo_root(args.directory)
    proposer, why = make_proposer(settings, root)
    console.line(why)
    with open_night(settings, root, console, "run") as night:
        Scheduler(night, proposer).run()
        if settings.verify_at_end and not night.stop.is_set():
            from autoloop.verification.verify import verify_at_end

            verify_at_end(night, settings)
    return night.stop.exit_status()


def cmd_trial(args) -> int:
    from autoloop.engine.attempt import AttemptRunner, Slot
    from autoloop.engine.night import open_night
    from autoloop.engine.trial import judge_edit
    from autoloop.observe.console import Console
    from autoloop.store.state import StateFile

    settings = settings_from(args)
    with open_night(settings, _repo_root(args.directory), Console(), "trial") as night:
        slot = Slot(night.ws, StateFile(night.layout.root), None, night.executor)
        record = judge_edit(night, AttemptRunner(night, slot), args.message)
    # The last line is for the agent that called us: verdict and metric, easy to parse.
    metric = "-" if record.metric is None else f"{record.metric:.6f}"
    crash = f" {record.crash}" if record.crash else ""
    print(f"verdict: {record.status}{crash} {settings.metric}: {metric} reason: {record.reason}")
    return night.stop.exit_status() or (0 if record.status != "crash" else 3)


def cmd_verify(args) -> int:
    from autoloop.engine.night import open_night
    from autoloop.observe.console import Console
    from autoloop.verification.verify import run_verification
    from autoloop.verification.verify_plan import summary_lines

    settings = settings_from(args)   # --resume too: open_night recovers a killed verification first
    console = Console()
    with open_night(settings, _repo_root(args.directory), console, "verify") as night:
        summary = run_verification(night, settings, resume=args.resume)
    for line in summary_lines(summary):
        console.line(line)
    return night.stop.exit_status()


def cmd_doctor(args) -> int:
    from autoloop.cli.doctor import run_doctor

    checks = run_doctor(_repo_root(args.directory), lambda: settings_from(args), print)
    return 1 if any(c.status == "fail" for c in checks) else 0


def cmd_status(args) -> int:
    from autoloop.core.layout import Layout
    from autoloop.review.report import status_data, status_json, status_text

    data = status_data(Layout.of(_repo_root(args.directory)).root)
    print(status_json(data) if args.json else status_text(data))
    return 0


def cmd_report(args) -> int:
    from autoloop.core.layout import Layout
    from autoloop.review.report import write_report
    from autoloop.review.since_last import write_mark

    root = _repo_root(args.directory)
    results = Layout.of(root).root
    if args.since_last:
        return _report_since_last(root, results)
    files = write_report(results, Path(args.output).resolve() if args.output else results)
    write_mark(results, files.tag, files.records)   # where --since-last starts next time
    shown = [files.markdown] + ([files.picture] if files.picture else [])
    print("wrote " + " and ".join(_shown_path(p, root) for p in shown))
    if files.note:
        print(f"no picture: {files.note}")
    for line in files.not_ours:
        print(f"not autoloop's: {line}")
    return 0


def _report_since_last(root: Path, results: Path) -> int:
    """The rows added since the previous report, each kept change with its diff."""
    from autoloop.review.report import ReportError
    from autoloop.review.since_last import read_mark, since_last_text, start_index, write_mark
    from autoloop.store.ledger import Ledger
    from autoloop.store.state import load_state

    ledger = Ledger(results)
    if not ledger.path.exists():
        raise ReportError(f"no ledger at {ledger.path}: nothing to report (run autoloop run first)")
    records = ledger.records()
    tag, mark = load_state(results).tag, read_mark(results)
    print(since_last_text(root, records, start_index(records, mark, tag), mark, tag))
    write_mark(results, tag, records)
    return 0


def cmd_note(args) -> int:
    """#17: a note from the person to every later prompt, or --clear, or the notes in force."""
    from autoloop.core.layout import Layout
    from autoloop.store.person_notes import PersonNotesError, active_notes, add_note, clear_notes

    root = _repo_root(args.directory)
    if not (root / ".git").exists():
        raise PersonNotesError(f"{root} is not a git repository: run autoloop note in the experiment repository "
                               "(or give it with -C DIR)")
    if args.clear and args.text:
        raise PersonNotesError("give a note or --clear, not both")
    results = Layout.of(root).root
    if args.clear:
        n = clear_notes(results)
        print(f"cleared {n} note{'s' if n != 1 else ''}: later prompts carry none" if n else "no notes to clear")
        return 0
    if args.text:
        note = add_note(results, " ".join(args.text))
        print(f"noted at {_hhmm(note.at)}: every later prompt carries it (autoloop note --clear drops it)")
        return 0
    notes = active_notes(results)
    for note in notes:
        print(f"{_hhmm(note.at)}  {note.text}")
    if not notes:
        print('no notes in force (add one: autoloop note "try SwiGLU; leave the LRs alone")')
    return 0


def _hhmm(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def cmd_finalize(args) -> int:
    from autoloop.review.finalize import RESULTS_PREFIX, finalize

    root = _repo_root(args.directory)
    result = finalize(root, tag=args.tag, branch=args.branch, squash_overlapping=args.squash_overlapping,
                      results_commit=not args.no_results, drop_unproven=args.drop_unproven)
    n = len(result.commits)
    print(f"created {result.branch}: {n} commit{'s' if n != 1 else ''} on top of the baseline {result.base[:7]}")
    for commit in result.commits:
        print(f"  {commit.sha[:7]} {commit.subject}")
    if result.results:
        print(f"  {result.results.sha[:7]} {result.results.subject} ({', '.join(result.results_paths)})")
    for warning in result.warnings:
        print(f"note: {warning}")
    for change, verdict in result.dropped:
        print(f"left out: trial {change.record.trial} {change.record.description.splitlines()[0]} "
              f"({verdict} in autoloop verify)")
    if result.dropped:
        print(f"its tree is the best {result.best[:7]} without the change(s) left out")
    elif result.differs:
        print(f"note: its tree differs from the best commit {result.best[:7]} in {', '.join(result.differs)} "
              "(changes no kept trial made)")
    elif result.best:
        aside = f" (apart from {RESULTS_PREFIX}/)" if result.results else ""
        print(f"its tree equals the best commit {result.best[:7]}{aside}; autoloop/{result.tag} is unchanged")
    print(f"review: git log -p {result.base[:7]}..{result.branch}")
    return 0


def cmd_dashboard(args) -> int:
    """The live, read-only web page of the night."""
    from autoloop.review.dashboard.server import serve

    try:
        serve(_repo_root(args.directory), args.host, args.port, print_flush)
    except KeyboardInterrupt:
        print("dashboard stopped")
    return 0


def print_flush(text: str) -> None:
    print(text, flush=True)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got '{text}'") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {value}")
    return value


def _shown_path(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def cmd_init(args) -> int:
    from autoloop.cli.scaffold import init_experiment

    path = init_experiment(Path(args.path))
    print(f"created an experiment repository in {path}")
    print(f"next: cd {path} && autoloop run --budget 5m --hours 8")
    return 0


def _repo_root(directory: str) -> Path:
    """The git work tree containing ``directory`` (the directory itself when none: the
    workspace then reports the problem in one line)."""
    path = Path(directory).resolve()
    for candidate in (path, *path.parents):
        if (candidate / ".git").exists():
            return candidate
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autoloop",
        description="Autonomous experiment loop: propose one change to train.py, train for a fixed "
                    "budget, keep it if val_bpb improved, else reset. Every attempt is recorded.",
    )
    parser.add_argument("--version", action="version", version=f"autoloop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # One function per subcommand, in the order --help lists them.
    for add in (_add_prepare, _add_run, _add_trial, _add_verify, _add_doctor, _add_status, _add_report,
                _add_note, _add_finalize, _add_dashboard, _add_init):
        add(sub)
    return parser


def _directory_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-C", "--directory", default=".", help="the experiment repository (default: here)")


def _add_prepare(sub) -> None:
    from autoloop.data import DEFAULT_AUDIT_BYTES, DEFAULT_VAL_BYTES

    p = sub.add_parser(
        "prepare", help="build the train/val/audit split of a corpus (idempotent)",
        description="Build the pinned train/validation/audit split of a corpus into a data directory "
                    "and print its size and fingerprint. Running it again on the same corpus changes "
                    "nothing. train.py prepares the default corpus by itself on first use.",
    )
    p.add_argument("--corpus", default="stdlib", metavar="SOURCE",
                   help="'stdlib' (default: this Python's standard-library sources) or a directory, "
                        "file or glob of text files")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="where to write the prepared data (default: $AUTOLOOP_DATA_DIR, else a "
                        "per-user cache folder named after the corpus)")
    p.add_argument("--val-bytes", type=_positive_int, default=DEFAULT_VAL_BYTES, metavar="N",
                   help=f"size of the pinned validation slice (default {DEFAULT_VAL_BYTES:,})")
    p.add_argument("--audit-bytes", type=_positive_int, default=DEFAULT_AUDIT_BYTES, metavar="N",
                   help=f"size of the held-out audit slice (default {DEFAULT_AUDIT_BYTES:,})")
    p.set_defaults(func=cmd_prepare)


def _add_run(sub) -> None:
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
    p.set_defaults(func=cmd_run)


def _add_trial(sub) -> None:
    from autoloop.cli.flags import add_setting_flags

    p = sub.add_parser(
        "trial", help="judge the current edit of the target as one trial (for agents that drive themselves)",
        description="Commit the current edit of the target, train it, keep or reset it, record it, and print "
                    "the verdict as the last line: 'verdict: keep|discard|crash [class] val_bpb: X reason: ...'. "
                    "Exit code 0 for keep/discard, 3 for a crash, 130/143 when stopped by SIGINT/SIGTERM. The first call on a branch runs the baseline "
                    "of the unmodified target first.",
    )
    p.add_argument("-m", "--message", required=True, help="one line: what this change tries")
    add_setting_flags(p, "trial")
    _directory_flag(p)
    p.set_defaults(func=cmd_trial)


def _add_verify(sub) -> None:
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
    _directory_flag(p)
    p.set_defaults(func=cmd_verify)


def _add_doctor(sub) -> None:
    from autoloop.cli.flags import add_setting_flags

    p = sub.add_parser(
        "doctor", help="check that this repository and machine are ready for a night (one line per check)",
        description="Check git and its identity, a clean tree, the target's contract, the data, torch and the "
                    "device (GPU name, free memory), free disk, the configured agent (its preflight: executable, "
                    "version, login or API key), the optional extras and --isolate. One line each: ok, warn or "
                    "fail. Exit code 1 when any check fails. Settings come from autoloop.toml / pyproject.toml "
                    "and the flags below, the same as autoloop run takes; nothing trains and nothing reaches "
                    "the network.",
        epilog="example: autoloop doctor --agent claude",
    )
    add_setting_flags(p, "run")
    _directory_flag(p)
    p.set_defaults(func=cmd_doctor)


def _add_status(sub) -> None:
    p = sub.add_parser("status", help="where the loop stands (safe while it runs)",
                       description="Current trial and phase, best and baseline metric, counts by status and "
                                   "crash class, pace and time left. Reads results/ only.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _directory_flag(p)
    p.set_defaults(func=cmd_status)


def _add_report(sub) -> None:
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
    p.set_defaults(func=cmd_report)


def _add_note(sub) -> None:
    p = sub.add_parser("note", help="tell the agent something: a note every later prompt carries (safe while the loop runs)",
                       description="Add a timestamped note that every later agent prompt carries, in the research "
                                   "digest, until autoloop note --clear; without arguments, list the notes in force. "
                                   "Safe from another shell while the loop runs: the next proposal reads it. Notes "
                                   "and clears are kept in results/person-notes.json and listed in the report.",
                       epilog='example: autoloop note "try SwiGLU; leave the learning rates alone"')
    p.add_argument("text", nargs="*", metavar="TEXT", help="the note (one line; quote it)")
    p.add_argument("--clear", action="store_true", help="drop the notes in force (the report still lists them)")
    _directory_flag(p)
    p.set_defaults(func=cmd_note)


def _add_finalize(sub) -> None:
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
    _directory_flag(p)
    p.set_defaults(func=cmd_finalize)


def _add_dashboard(sub) -> None:
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
    p.set_defaults(func=cmd_dashboard)


def _add_init(sub) -> None:
    p = sub.add_parser("init", help="create a fresh experiment repository",
                       description="Create DIR with train.py, program.md, .gitignore and a first commit, "
                                   "ready for autoloop run.")
    p.add_argument("path", metavar="DIR", help="folder to create (must not exist or be empty)")
    p.set_defaults(func=cmd_init)


def main(argv: list[str] | None = None) -> int:
    from autoloop.core.errors import AutoloopError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.func(args)
    except AutoloopError as e:   # every error meant for the user (errors.py)
        print(f"autoloop: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("autoloop: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a bug of ours: one line, the traceback on request
        if os.environ.get("AUTOLOOP_DEBUG"):
            raise
        print(f"autoloop: internal error: {type(e).__name__}: {e} (recorded results are safe: "
              "autoloop run --resume recovers an interrupted trial; AUTOLOOP_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
