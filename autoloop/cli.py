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


def _count(text: str) -> int:
    """A whole number >= 0 (0 is meaningful: --max-fix-attempts 0 turns fixing off)."""
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
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


# Flags shared by `run` and `trial`, each mapping to the Settings field of the same name.
def _add_experiment_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", metavar="DURATION", help="training time per trial: 300, 300s, 5m, 1h30m (default 5m)")
    p.add_argument("--timeout", metavar="DURATION",
                   help="hard limit per trial, start-up and evaluation included (default max(2 x budget, budget + 2m))")
    p.add_argument("--target", metavar="FILE", help="the one file a proposer may edit (default train.py)")
    p.add_argument("--command", metavar="CMD",
                   help="trial command (default: this Python on the target; e.g. 'uv run train.py')")
    p.add_argument("--metric", metavar="NAME", help="metric name the trial prints as 'NAME: value' (default val_bpb)")
    p.add_argument("--direction", choices=["min", "max"], help="whether lower or higher is better (default min)")
    p.add_argument("--tag", metavar="TAG", help="work on branch autoloop/TAG (default: today, e.g. nov29)")
    p.add_argument("--min-delta", type=float, metavar="X", help="a keep must beat the best by more than X (default 0)")
    p.add_argument("--seed", type=int, metavar="N", help="seed handed to every trial (default 42)")
    p.add_argument("--noise-runs", type=_count, metavar="N",
                   help="extra runs of the baseline with seeds seed+1.. to estimate the noise (default 2; 0: off)")
    p.add_argument("--keep-rule", choices=["auto", "noise", "strict"],
                   help="noise: keep only beyond max(min-delta, z x noise), confirm borderline gains with a re-run; "
                        "strict: keep any gain > min-delta (default auto: noise once an estimate exists)")
    p.add_argument("--noise-z", type=float, metavar="Z", help="z of the noise rule (default 2.0)")
    p.add_argument("--max-rss-gb", type=float, metavar="GB", help="kill a trial whose processes use more memory than this")
    p.add_argument("--sanity-bound", type=float, metavar="X",
                   help="re-run a trial whose gain exceeds X x |best| before keeping it, and keep it only if the "
                        "re-run beats the best too (default 0.1, i.e. 10%%; 0: off)")
    p.add_argument("--corpus", metavar="SOURCE", help="'stdlib' (default) or a directory, file or glob of text")
    p.add_argument("--data-dir", metavar="DIR", help="prepared data folder (default: per-user cache)")
    p.add_argument("--device", metavar="DEV", help="cpu, cuda, cuda:N or mps (default: auto-detect)")
    p.add_argument("--log-cap-mb", type=float, metavar="MB",
                   help="keep each run log under MB: its first and last halves around a line saying what was cut "
                        "(default 32; 0: no cap)")
    p.add_argument("--min-free-gb", type=float, metavar="GB",
                   help="stop before a trial when the workspace, results or data disk has less free (default 2; 0: off)")
    p.add_argument("--isolate", action="store_true",
                   help="run trials without network access, in a network namespace of their own (Linux)")
    p.add_argument("--executor", choices=["local", "slurm"],
                   help="where trials run: local (default) or slurm, one job per trial through submitit")
    p.add_argument("--slurm-cluster", choices=["slurm", "local", "debug"],
                   help="submitit cluster: slurm (default, sbatch), or local/debug to try it without a cluster")
    p.add_argument("--slurm-partition", metavar="NAME", help="sbatch --partition")
    p.add_argument("--slurm-gpus-per-trial", type=_count, metavar="N", help="GPUs per trial job (default 1)")
    p.add_argument("--slurm-time-limit", metavar="DURATION",
                   help="the job's time limit, e.g. 20m (default: the trial timeout + 5m, rounded up to minutes)")
    p.add_argument("--slurm-option", dest="slurm_options", action="append", type=_slurm_option, metavar="KEY=VALUE",
                   help="extra sbatch option as submitit names it, e.g. account=myproj or mem=64G (repeatable)")
    p.add_argument("--slurm-folder", metavar="DIR", help="submitit's job files (default results/slurm)")


def _slurm_option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


_SETTING_FLAGS = ["budget", "timeout", "target", "command", "metric", "direction", "tag", "min_delta", "seed",
                  "max_rss_gb", "corpus", "data_dir", "device", "hours", "max_trials", "proposer", "queue_dir",
                  "max_proposer_failures", "resume", "agent", "agent_cmd", "agent_timeout", "max_fix_attempts",
                  "max_agent_failures", "noise_runs", "keep_rule", "noise_z", "remeasure",
                  "sanity_bound"]
_SETTING_FLAGS += ["log_cap_mb", "min_free_gb", "isolate"]
_SETTING_FLAGS += ["executor", "slurm_cluster", "slurm_partition", "slurm_gpus_per_trial", "slurm_time_limit",
                   "slurm_options", "slurm_folder"]
_SETTING_FLAGS += ["workers", "devices"]
_SETTING_FLAGS += ["sampler", "portfolio"]   # #18


def _settings(args):
    from autoloop.config import load_settings

    # `is not`, not `in`: 0 == False, and --max-fix-attempts 0 is a real value.
    overrides = {k: getattr(args, k) for k in _SETTING_FLAGS
                 if getattr(args, k, None) is not None and getattr(args, k, None) is not False}
    if overrides.get("slurm_options"):
        overrides["slurm_options"] = dict(overrides["slurm_options"])   # [(key, value)] from --slurm-option
    return load_settings(Path(args.directory).resolve(), overrides)


def cmd_run(args) -> int:
    from autoloop.console import Console
    from autoloop.loop import Loop
    from autoloop.proposers import make_proposer

    settings = _settings(args)
    console = Console()
    root = _repo_root(args.directory)
    proposer, why = make_proposer(settings, root)
    console.line(why)
    if settings.workers > 1:
        from autoloop.workers import WorkerPool
        WorkerPool(settings, root, proposer, console).run()
        return 0
    Loop(settings, root, proposer, console).run()
    return 0


def cmd_trial(args) -> int:
    from autoloop.console import Console
    from autoloop.loop import run_single_trial

    settings = _settings(args)
    record = run_single_trial(settings, _repo_root(args.directory), args.message, Console())
    # The last line is for the agent that called us: verdict and metric, easy to parse.
    metric = "-" if record.metric is None else f"{record.metric:.6f}"
    crash = f" {record.crash}" if record.crash else ""
    print(f"verdict: {record.status}{crash} {settings.metric}: {metric} reason: {record.reason}")
    return 0 if record.status != "crash" else 3


def cmd_status(args) -> int:
    from autoloop.report import status_data, status_json, status_text

    results = _repo_root(args.directory) / "results"
    data = status_data(results)
    print(status_json(data) if args.json else status_text(data))
    return 0


def cmd_report(args) -> int:
    from autoloop.report import write_report

    root = _repo_root(args.directory)
    output = Path(args.output).resolve() if args.output else root / "results"
    files = write_report(root / "results", output)
    shown = [files.markdown] + ([files.picture] if files.picture else [])
    print("wrote " + " and ".join(_shown_path(p, root) for p in shown))
    if files.note:
        print(f"no picture: {files.note}")
    return 0


def cmd_finalize(args) -> int:
    from autoloop.finalize import finalize

    root = _repo_root(args.directory)
    result = finalize(root, tag=args.tag, branch=args.branch, squash_overlapping=args.squash_overlapping)
    n = len(result.commits)
    print(f"created {result.branch}: {n} commit{'s' if n != 1 else ''} on top of the baseline {result.base[:7]}")
    for commit in result.commits:
        print(f"  {commit.sha[:7]} {commit.subject}")
    if result.differs:
        print(f"note: its tree differs from the best commit {result.best[:7]} in {', '.join(result.differs)} "
              "(changes no kept trial made)")
    elif result.best:
        print(f"its tree equals the best commit {result.best[:7]}; autoloop/{result.tag} is unchanged")
    print(f"review: git log -p {result.base[:7]}..{result.branch}")
    return 0


def _shown_path(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def cmd_init(args) -> int:
    from autoloop.scaffold import init_experiment

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
    from autoloop.data import DEFAULT_AUDIT_BYTES, DEFAULT_VAL_BYTES

    parser = argparse.ArgumentParser(
        prog="autoloop",
        description="Autonomous experiment loop: propose one change to train.py, train for a fixed "
                    "budget, keep it if val_bpb improved, else reset. Every attempt is recorded.",
    )
    parser.add_argument("--version", action="version", version=f"autoloop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

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

    p = sub.add_parser(
        "run", help="run the experiment loop (the main job)",
        description="Ask the proposer for one change to the target, commit it, train for the budget, keep "
                    "the commit if the metric improved, else reset; record every attempt in "
                    "results/ledger.jsonl and results/results.tsv. The first trial is the baseline of the "
                    "unmodified target. Ctrl-C stops cleanly; after a crash or kill, --resume continues.",
        epilog="example: autoloop run --budget 5m --hours 8",
    )
    _add_experiment_flags(p)
    p.add_argument("--hours", type=float, metavar="H", help="stop starting trials that could not finish within H hours")
    p.add_argument("--max-trials", type=_positive_int, metavar="N", help="stop after N trials in this run")
    p.add_argument("--proposer", choices=["auto", "queue", "mutate", "agent", "optuna", "portfolio"],
                   help="where changes come from (default auto: the portfolio when --portfolio is given, else the "
                        "agent when one is configured, else the queue when patches are waiting, else mutate); "
                        "optuna: Bayesian or evolutionary search over train.py's constants, several per trial "
                        "(needs pip install 'autoloop[hpo]'); portfolio: a bandit shares the night among proposers")
    # #18: flags of the optuna and portfolio proposers.
    p.add_argument("--sampler", choices=["tpe", "cmaes", "gp"],
                   help="Optuna's sampler for --proposer optuna and a portfolio's optuna: tpe (default, Bayesian), "
                        "cmaes (evolution strategy), gp (Gaussian process)")
    p.add_argument("--portfolio", metavar="LIST",
                   help="the proposers that share the night, e.g. agent,optuna,mutate (implies --proposer "
                        "portfolio; default with --proposer portfolio: agent if configured, optuna, mutate)")
    p.add_argument("--queue-dir", metavar="DIR", help="folder of *.patch / *.py changes for the queue proposer "
                                                      "(default results/queue)")
    p.add_argument("--max-proposer-failures", type=_positive_int, metavar="N",
                   help="stop after N failed proposals in a row (default 5)")
    p.add_argument("--agent", choices=["claude", "codex", "aider", "gemini"],
                   help="coding agent preset: Claude Code, Codex CLI, Aider or Gemini CLI (commands in the README)")
    p.add_argument("--agent-cmd", metavar="CMD",
                   help="any other agent command, run in the workspace with the prompt on stdin; "
                        "{prompt_file}, {description_file}, {target} are filled in")
    p.add_argument("--agent-timeout", metavar="DURATION",
                   help="kill the agent's whole process tree after this long per call (default 15m)")
    p.add_argument("--max-fix-attempts", type=_count, metavar="N",
                   help="fix requests for a trivially-crashed trial (default 2; 0: no fixing)")
    p.add_argument("--max-agent-failures", type=_positive_int, metavar="N",
                   help="stop after the agent failed N times in a row (default 5)")
    p.add_argument("--remeasure", action="store_true",
                   help="re-run the best commit --noise-runs times first and re-estimate the noise")
    p.add_argument("--resume", action="store_true",
                   help="continue the existing branch, recovering an interrupted trial first")
    p.add_argument("--workers", type=_positive_int, metavar="N",
                   help="run N trials at once, each in its own git worktree under worktrees/ (default 1)")
    p.add_argument("--devices", metavar="LIST",
                   help="CUDA devices of the workers, one each: 0,1,2,3 (default: one GPU per worker when "
                        "there are enough, else all on CPU, sharing the cores)")
    p.add_argument("-C", "--directory", default=".", help="the experiment repository (default: here)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "trial", help="judge the current edit of the target as one trial (for agents that drive themselves)",
        description="Commit the current edit of the target, train it, keep or reset it, record it, and print "
                    "the verdict as the last line: 'verdict: keep|discard|crash [class] val_bpb: X reason: ...'. "
                    "Exit code 0 for keep/discard, 3 for a crash. The first call on a branch runs the baseline "
                    "of the unmodified target first.",
    )
    p.add_argument("-m", "--message", required=True, help="one line: what this change tries")
    _add_experiment_flags(p)
    p.add_argument("-C", "--directory", default=".", help="the experiment repository (default: here)")
    p.set_defaults(func=cmd_trial)

    p = sub.add_parser("status", help="where the loop stands (safe while it runs)",
                       description="Current trial and phase, best and baseline metric, counts by status and "
                                   "crash class, pace and time left. Reads results/ only.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-C", "--directory", default=".", help="the experiment repository (default: here)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("report", help="write the morning summary: results/report.md and results/progress.png",
                       description="Baseline vs best, the kept changes with their deltas, crashes by class with "
                                   "their reasons, the noise estimate and where the wall time went, in report.md; "
                                   "the metric per attempt in progress.png (needs matplotlib: "
                                   "pip install autoloop[plot]). Reads results/ only; safe while the loop runs.")
    p.add_argument("--output", metavar="DIR", help="where to write report.md and progress.png (default results/)")
    p.add_argument("-C", "--directory", default=".", help="the experiment repository (default: here)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("finalize", help="the kept changes as a clean branch: one commit each, metrics in the messages",
                       description="Create a new branch (default autoloop/<tag>-final) from the baseline commit "
                                   "with one commit per kept change, in ledger order, each message giving the "
                                   "description and the metric before and after. Uses git plumbing only: the "
                                   "work tree, the index, HEAD and the loop's branch are left as they are.")
    p.add_argument("--tag", metavar="TAG", help="which night (default: the tag of results/, else the checked-out "
                                                "autoloop/TAG branch)")
    p.add_argument("--branch", metavar="NAME", help="name of the new branch (default autoloop/<tag>-final); "
                                                    "refused if it exists")
    p.add_argument("--squash-overlapping", action="store_true",
                   help="one commit for consecutive kept changes that touch overlapping lines")
    p.add_argument("-C", "--directory", default=".", help="the experiment repository (default: here)")
    p.set_defaults(func=cmd_finalize)

    p = sub.add_parser("init", help="create a fresh experiment repository",
                       description="Create DIR with train.py, program.md, .gitignore and a first commit, "
                                   "ready for autoloop run.")
    p.add_argument("path", metavar="DIR", help="folder to create (must not exist or be empty)")
    p.set_defaults(func=cmd_init)
    return parser


def main(argv: list[str] | None = None) -> int:
    from autoloop.config import ConfigError
    from autoloop.data import DataError
    from autoloop.finalize import FinalizeError
    from autoloop.ledger import LedgerError
    from autoloop.loop import LoopError
    from autoloop.proposers import ProposerError
    from autoloop.report import ReportError
    from autoloop.scaffold import ScaffoldError
    from autoloop.workspace import WorkspaceError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.func(args)
    except (ConfigError, DataError, FinalizeError, LedgerError, LoopError, ProposerError, ReportError,
            ScaffoldError, WorkspaceError) as e:
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
