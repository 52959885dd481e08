"""An internal error (a bug of ours) keeps its traceback: one line on stderr, exit status 70,
and a log file, named in that line, with the traceback and the versions a bug report needs.

The bug is real: a subprocess replaces a function `autoloop status` calls with one that
raises, then runs the command line's main() as the `autoloop` command does. Nothing in the
product knows about the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from helpers.git import init_repo

REPO_ROOT = Path(__file__).resolve().parent.parent
# status_data is imported by `autoloop status` when it runs, so the replacement is the one it calls.
BUGGY_STATUS = ("import sys\n"
                "import autoloop.review.status as status\n"
                "def status_data(results):\n"
                "    raise ZeroDivisionError('a bug on purpose')\n"
                "status.status_data = status_data\n"
                "from autoloop.cli.main import main\n"
                "sys.exit(main(sys.argv[1:]))\n")
LINE = re.compile(r"^autoloop: internal error: ZeroDivisionError: a bug on purpose "
                  r"\(traceback in (?P<log>\S+internal-error-\d{8}T\d{6}Z\.log); "
                  r"please attach it to a bug report; recorded results are safe, "
                  r"autoloop run --resume recovers an interrupted trial\)$")


def _run_buggy_status(cwd: Path, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
           "TMPDIR": str(tmp)}
    env.pop("AUTOLOOP_DEBUG", None)
    return subprocess.run([sys.executable, "-c", BUGGY_STATUS, "status"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _check_log(text: str) -> None:
    assert "command: autoloop status" in text
    assert re.search(r"^  autoloop \d+\.\d+", text, re.MULTILINE)
    assert re.search(rf"^  Python {re.escape(sys.version.split()[0])} ", text, re.MULTILINE)
    assert re.search(r"^  torch \S", text, re.MULTILINE)
    assert re.search(r"^  git version \d", text, re.MULTILINE)
    assert "Traceback (most recent call last):" in text
    assert "in status_data" in text and text.rstrip().endswith("ZeroDivisionError: a bug on purpose")


def test_an_internal_error_writes_its_traceback_under_results(tmp_path):
    repo = init_repo(tmp_path / "repo")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _run_buggy_status(repo, tmp)
    assert proc.returncode == 70, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    match = LINE.match(lines[0])
    assert match, lines[0]
    assert match["log"].startswith("results/internal-error-")
    _check_log((repo / match["log"]).read_text())
    assert not list(tmp.iterdir())
    assert "Traceback" not in proc.stdout


def test_outside_a_repository_the_log_goes_to_the_temporary_folder(tmp_path):
    here = tmp_path / "not-a-repo"
    here.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _run_buggy_status(here, tmp)
    assert proc.returncode == 70, proc.stderr
    match = LINE.match(proc.stderr.strip())
    assert match, proc.stderr
    log = Path(match["log"])
    assert log.parent == tmp and not (here / "results").exists()
    _check_log(log.read_text())


def test_a_disk_that_refuses_a_write_is_one_line_not_a_bug_and_resume_loses_nothing(tmp_path, tiny_data_dir):
    """A full disk is the machine's trouble: one line naming the file and what to do, exit 1,
    no bug-report log; the night resumed afterwards records every attempt once."""
    from helpers.loop import GOOD, SLOW, assert_invariants, autoloop, queue_file, read_ledger, run_args

    repo = init_repo(tmp_path / "repo", {"train.py": SLOW})
    queue_file(repo, "01_good.py", GOOD, "restore learning rates")
    # The second append to the ledger (the candidate's record, after the baseline's) fails.
    proc = autoloop(repo, *run_args(), data_dir=tiny_data_dir, env={"AUTOLOOP_FAULT_WRITE": "ENOSPC:ledger.jsonl:2"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "autoloop: the disk refused a write results/ledger.jsonl: No space left on device; what was recorded "
        "is safe: fix the disk (free space, a quota, a read-only mount), then autoloop run --resume"], proc.stderr
    assert not list((repo / "results").glob("internal-error-*.log"))
    assert [r["kind"] for r in read_ledger(repo)] == ["baseline"]
    resumed = autoloop(repo, *run_args(), "--resume", data_dir=tiny_data_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    ledger = assert_invariants(repo)
    assert [r["description"] for r in ledger if r["kind"] != "baseline"][-1] == "restore learning rates", ledger


def test_a_ctrl_c_before_the_command_runs_is_exit_130_without_a_traceback(tmp_path):
    """Ctrl-C while the command line still imports and builds its parser (the first half
    second of `autoloop run`, before a night's own signal handling) printed Python's
    KeyboardInterrupt traceback and exited -2. The parser raises it here as SIGINT would."""
    script = ("import sys, signal\n"
              "import autoloop.cli.main\n"
              "cli = sys.modules['autoloop.cli.main']   # the package's `main` is the function\n"
              "def build_parser():\n"
              "    signal.raise_signal(signal.SIGINT)\n"
              "cli.build_parser = build_parser\n"
              "sys.exit(cli.main(['status']))\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=init_repo(tmp_path / "repo", {"train.py": "x = 1\n"}),
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert proc.stderr == "autoloop: interrupted\n", proc.stderr
