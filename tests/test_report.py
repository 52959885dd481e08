"""The words and pictures for people: verdict and live lines, the console, report.md and
progress.png, on ledgers built by hand in real git repos (no training)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.git import git
from helpers.night import Step, build_night, realistic_steps, set_values

from autoloop.observe.console import Console, format_verdict, live_line, parse_progress, plain
from autoloop.review.report import eval_seconds, report_markdown, time_split, write_report
from autoloop.store.ledger import LedgerRecord

PROGRESS = ("step 00123 (41.0%) | loss: 2.3450 | lrm: 1.00 | dt: 52ms | tok/sec: 78,769 | remaining: 177s")


def record(**kw) -> LedgerRecord:
    base = dict(trial=17, attempt=1, started_at=0.0, ended_at=1.0, proposer="agent", parent="a" * 40,
                commit="b" * 40, description="MATRIX_LR 0.04 -> 0.06", status="keep", metric=1.0234)
    return LedgerRecord(**{**base, **kw})


def cli(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoloop.cli", *args], cwd=repo, capture_output=True, text=True,
                          timeout=120)


# ------------------------------------------------------------------------------ lines while it runs


def test_parse_progress_reads_train_py_lines():
    assert parse_progress(PROGRESS) == {"step": 123, "percent": 41.0, "loss": 2.345}
    assert parse_progress("step 00007 (0.3%) | loss: nan | lrm: 1.00")["loss"] != parse_progress(PROGRESS)["loss"]
    assert parse_progress("compiling...") == {}
    assert parse_progress(None) == {}


def test_verdict_line_with_and_without_noise():
    assert format_verdict("#17", record(noise=0.00128), 1.0275) == \
        "#17 keep 1.0234 (-0.0041, 3.2σ) MATRIX_LR 0.04 -> 0.06"
    assert format_verdict("#17", record(), 1.0275) == "#17 keep 1.0234 (-0.0041) MATRIX_LR 0.04 -> 0.06"
    # The last run of a confirmation: kept on the mean of its runs, which the line says beside the run's own.
    assert format_verdict("#17.4", record(attempt=4, kind="confirm", metric=1.0300,
                                          extra={"runs": [1.0220, 1.0230, 1.0250, 1.0300]}), 1.0275) == \
        "#17.4 keep 1.0300 (+0.0025, mean of 4 runs 1.0250, -0.0025) MATRIX_LR 0.04 -> 0.06"
    assert format_verdict("#18", record(trial=18, status="discard", metric=1.0301, description="x"), 1.0234) \
        == "#18 discard 1.0301 (+0.0067) x"
    # A change too small for 4 decimals is shown with 6 rather than as (+0.0000).
    assert format_verdict("#19", record(status="discard", metric=1.02341, description="y"), 1.0234) \
        == "#19 discard 1.023410 (+0.000010) y"
    assert format_verdict("#0", record(trial=0, kind="baseline", description="baseline", metric=1.0275), None) \
        == "#0 keep 1.0275 baseline"
    sample = record(trial=0, attempt=2, kind="confirm", metric=1.0270, description="noise sample 1/2",
                    extra={"noise_samples": [1.0275, 1.027]})
    assert format_verdict("#0.2", sample, 1.0275) == "#0.2 noise sample 1.0270 (-0.0005) noise sample 1/2"
    crash = record(status="crash", crash="trivial", metric=None, reason="NameError: name 'x' is not defined")
    assert format_verdict("#17.2", crash, 1.0275) \
        == "#17.2 crash (trivial) MATRIX_LR 0.04 -> 0.06: NameError: name 'x' is not defined"


def test_live_line_has_every_part():
    line = live_line("#17", "training", 123.4, 300, PROGRESS, 1.0275, 6 * 3600 + 12 * 60 + 29)
    assert line == "#17 training 41% of 5m, 2m3s in | loss 2.3450 | best 1.0275 | stops in 6h12m"
    assert live_line("#3", "training", 2.2, 8, None, None, 59.6) == "#3 training (budget 8s), 2s in | stops in 1m"


def test_console_without_terminal_writes_plain_lines_only():
    out = io.StringIO()
    console = Console(out)                      # StringIO is no terminal: live is off
    assert console.live is False
    console.status("#3 training 2s/8s | loss 2.3450")   # dropped: no live line in a log
    console.line("#3 keep 1.0234 (-0.0041, 3.2σ) restore\rlearning \x1b[31mrates\x1b[0m\tnow\n")
    console.line("plain")
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text and "\t" not in text
    lines = text.splitlines()
    assert len(lines) == 2 and lines[0].endswith("#3 keep 1.0234 (-0.0041, 3.2σ) restore learning rates now")
    assert re.fullmatch(r"\d\d:\d\d:\d\d plain", lines[1])


def test_console_on_a_terminal_redraws_the_live_line():
    out = io.StringIO()
    console = Console(out, live=True)
    console.status("#3 training\x1b[2J 2s")
    console.line("#3 keep")
    text = out.getvalue()
    assert text.startswith("\r\x1b[2K#3 training 2s")           # the stray escape from the text is gone
    assert "\x1b[2J" not in text and text.count("\r\x1b[2K") == 2  # cleared before the permanent line


def test_console_falls_back_to_ascii_on_a_narrow_encoding():
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    Console(stream).line("#1 keep 1.0234 (-0.0041, 3.2σ) x")
    stream.flush()
    assert raw.getvalue().decode("ascii").endswith("(-0.0041, 3.2sd) x\n")
    assert plain("a\x1b]0;title\x07b\x08c") == "ab c"


# ------------------------------------------------------------------------------ report.md


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    return build_night(tmp_path_factory.mktemp("night"), realistic_steps(), tag="nov29")


def test_report_content_for_a_known_ledger(night):
    records = night.records
    md = report_markdown(records, eval_seconds(night.results, records), tag="nov29")
    assert md.startswith("# autoloop report: autoloop/nov29\n")
    assert "29 attempts of 28 trials" in md
    assert f"| baseline | 1.027500 | `{night.baseline[:7]}` | 0 |" in md
    assert f"| best | 1.015900 | `{night.best[:7]}` | 25 |" in md
    assert "| change | -0.011600 (-1.13%) | 6 kept changes | |" in md
    assert "![val_bpb per attempt](progress.png)" in md

    kept = re.findall(r"^\| (\d) \| (\S+) \| `(\w{7})` \| ([\d.]+) \| ([-+][\d.]+) \| \S+ \| (.+) \| - \|$", md, re.M)
    assert [(k[0], k[1], k[3], k[4], k[5]) for k in kept] == [
        ("1", "1", "1.023400", "-0.004100", "MATRIX_LR 0.04 -> 0.06"),
        ("2", "6", "1.021200", "-0.002200", "weight decay 0 -> 0.1"),
        ("3", "11", "1.019600", "-0.001600", "warmdown 0.5 -> 0.7"),
        ("4", "16", "1.018100", "-0.001500", "width 128 -> 160"),
        ("5", "21", "1.016800", "-0.001300", "HEAD_LR 0.004 -> 0.006"),
        ("6", "25", "1.015900", "-0.000900", "MATRIX_LR 0.06 -> 0.07"),
    ]
    assert kept[-1][2] == night.best[:7]
    assert "1 baseline run, 6 kept changes, 16 discarded, 6 crashed; 1 proposal skipped" in md
    assert "- 1 x patch does not apply: train.py:12" in md

    crashes = md[md.index("## Crashes"):md.index("## Noise")]
    assert crashes.index("### trivial (2)") < crashes.index("### fundamental (3)") < crashes.index("### timeout (1)")
    assert "- #5 swap GELU for ReLU^2: NameError: name 'relu2' is not defined (train.py:88)" in crashes
    assert "- #19 typo in schedule: SyntaxError: invalid syntax (train.py:140)" in crashes
    for reason in ("CUDA out of memory", "loss is nan at step 41", "killed by SIGSEGV"):
        assert reason in crashes[crashes.index("### fundamental"):crashes.index("### timeout")]
    assert "- #12 seq len 256 -> 512: ran past the hard limit of 12m" in crashes

    assert "0.001200 as of trial 28; 8 records carry one, ranging 0.001100 to 0.001200" in md
    assert "9.7 times that estimate" in md


def test_time_split_adds_up_and_is_explained(night):
    records = night.records
    evals = eval_seconds(night.results, records)
    assert len(evals) == 23 and set(evals.values()) == {12.5}   # kept and discarded attempts have result files
    split = time_split(records, evals)
    judged = [r for r in records if r.status != "skip"]
    assert split.training == pytest.approx(sum(r.training_seconds or 0 for r in judged))
    assert split.evaluation == pytest.approx(12.5 * 23)
    assert split.trial_other == pytest.approx(sum(r.wall_seconds for r in judged) - split.training - split.evaluation)
    assert split.harness == pytest.approx(sum(r.ended_at - r.started_at - r.wall_seconds for r in judged))
    assert split.between == pytest.approx(20.0 * 29)            # the gaps build_night left before each record
    assert split.span == pytest.approx(records[-1].ended_at - records[0].started_at)
    assert abs(split.unaccounted) < 1e-6
    md = report_markdown(records, evals)
    table = md[md.index("## Where the time went"):]
    for row in ("| training | 1h55m |", "| evaluation | 4m48s |", "| harness within attempts |",
                "| proposer and between attempts | 9m40s |", "| **total** | **2h41m16s** | 100% |"):
        assert row in table
    for how in ("`training_seconds`", "`eval_seconds`", "`wall_seconds`", "`started_at`", "`ended_at`"):
        assert how in table


def test_report_without_noise_or_crashes_says_so(tmp_path):
    n = build_night(tmp_path, [Step("a", "keep", 1.02, edit={"WIDTH": "1"}),
                               Step("b", "discard", 1.03, edit={"DEPTH": "2"})])
    md = report_markdown(n.records, {})
    assert "## Crashes\n\nNone." in md
    assert "No record carries a noise estimate" in md


# ------------------------------------------------------------------------------ progress.png and the CLI


def _pixels(path: Path):
    """(width, height) and an (N, 3) array of the picture's RGB pixels."""
    import numpy as np
    from PIL import Image

    image = Image.open(path).convert("RGB")
    return image.size, np.asarray(image).reshape(-1, 3).astype(int)


def test_report_command_writes_markdown_and_a_real_picture(night):
    proc = cli(night.repo, "report")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "wrote results/report.md and results/progress.png"
    md = (night.results / "report.md").read_text()
    assert "## Kept changes" in md and "![val_bpb per attempt](progress.png)" in md

    size, pixels = _pixels(night.results / "progress.png")
    assert size == (1200, 675)
    assert len({tuple(p) for p in pixels}) > 50                  # text, markers, lines: not a flat image
    non_white = (pixels != 255).any(axis=1).mean()
    assert 0.02 < non_white < 0.6

    def near(colour, tolerance=12):
        return int((abs(pixels - colour) <= tolerance).all(axis=1).sum())

    assert near((0x1a, 0x98, 0x50)) > 200     # kept points and the running-best line
    assert near((0xc5, 0x1b, 0x1b)) > 20      # fundamental crashes
    assert near((0x7b, 0x32, 0x94)) > 20      # the timeout
    assert near((0x2c, 0x5a, 0xa0)) > 20      # the baseline


def test_report_to_another_folder_and_errors(night, tmp_path):
    out = tmp_path / "out"
    proc = cli(night.repo, "report", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert (out / "report.md").exists() and (out / "progress.png").exists()

    empty = tmp_path / "empty"
    empty.mkdir()
    subprocess.run(["git", "init", "-q", str(empty)], check=True)
    proc = cli(empty, "report")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("autoloop: no ledger at ") and "nothing to report" in proc.stderr


def test_report_without_matplotlib_still_writes_markdown(night, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)          # import matplotlib -> ImportError
    files = write_report(night.results, tmp_path)
    assert files.picture is None and not (tmp_path / "progress.png").exists()
    md = files.markdown.read_text()
    assert "pip install autoloop[plot]" in md and "![" not in md


def test_picture_of_a_night_with_only_a_baseline_and_crashes(tmp_path):
    n = build_night(tmp_path, [Step("typo", "crash", crash="trivial", reason="NameError", edit={"WIDTH": "x"})])
    files = write_report(n.results)
    size, pixels = _pixels(files.picture)
    assert size == (1200, 675) and len({tuple(p) for p in pixels}) > 20


# ------------------------------------------------------------------------------ report --since-last


def test_report_since_last_lists_exactly_the_new_rows_with_the_kept_diffs(tmp_path):
    """A report, then more attempts, then --since-last: exactly those rows (skips are not rows),
    each kept change followed by its diff from git; then nothing new."""
    from autoloop.store.ledger import Ledger, tsv_row

    steps = realistic_steps()
    night = build_night(tmp_path, steps[:8])
    repo = night.repo
    first = cli(repo, "report", "--since-last")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("9 new rows in all (no earlier report of this ledger) on autoloop/t, "
                                   "2 kept changes with their diff:")
    proc = cli(repo, "report")            # a full report moves the mark too
    assert proc.returncode == 0, proc.stderr

    # Three more attempts as the loop would record them: a skip, a discard, a keep (with a commit).
    ledger = Ledger(night.results, fsync=False)
    best = night.records[-1]
    t = best.ended_at + 10
    source = set_values((repo / "train.py").read_text(), WIDTH="256")
    (repo / "train.py").write_text(source)
    git(repo, "commit", "-qam", "width 128 -> 256")
    kept_commit = git(repo, "rev-parse", "HEAD")
    new = [LedgerRecord(trial=9, started_at=t, ended_at=t, proposer="queue", parent=best.best, description="bad patch",
                        status="skip", reason="patch does not apply", best=best.best, best_metric=best.best_metric),
           LedgerRecord(trial=10, started_at=t + 1, ended_at=t + 2, proposer="queue", parent=best.best,
                        commit=best.best, description="same again \x1b[31mred\x1b[0m", status="discard",
                        metric=1.03, best=best.best, best_metric=best.best_metric),
           LedgerRecord(trial=11, started_at=t + 3, ended_at=t + 4, proposer="queue", parent=best.best,
                        commit=kept_commit, description="width 128 -> 256", status="keep", metric=1.0100,
                        best=kept_commit, best_metric=1.0100)]
    for record in new:
        ledger.append(record, write_tsv=False)

    proc = cli(repo, "report", "--since-last")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("2 new rows since the last report (") and lines[0].endswith(
        ") on autoloop/t, 1 kept change with its diff:")
    assert lines[2] == ("commit\tval_bpb\tmemory_gb\tstatus\tdescription\tcrash\ttrial\tseconds\tconfidence\tworker"
                        "\thypothesis")
    rows = [line for line in lines[3:] if line and not line.startswith("    ")]
    assert rows == ["\t".join(tsv_row(new[1])).replace("\x1b[31m", "").replace("\x1b[0m", ""),
                    "\t".join(tsv_row(new[2]))]
    assert "\x1b" not in proc.stdout
    diff = [line[4:] for line in lines if line.startswith("    ")]
    expected = subprocess.run(["git", "diff", best.best, kept_commit], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.splitlines()
    assert diff == expected and "+WIDTH = 256" in diff

    again = cli(repo, "report", "--since-last")
    assert again.returncode == 0 and again.stdout.startswith("no new rows since the last report (")
    assert not (night.results / "report-mark.json.tmp").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = cli(empty, "report", "--since-last")
    assert proc.returncode == 1 and proc.stderr.startswith("autoloop: no ledger at ") and proc.stderr.count("\n") == 1
