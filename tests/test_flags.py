"""The flags of `run` and `trial` are generated from the settings (autoloop.cli.flags): every
setting has one, in its section of --help, with the field's own default; values are
checked by the field, so a bad one reads the same from a flag as from a file."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from autoloop.cli.main import build_parser, settings_from
from autoloop.config.settings import SECTIONS, Settings, flag_of


def help_of(command: str) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return sub.format_help()


def option_line(text: str, flag: str) -> int:
    """Where the flag's own line of --help starts (two spaces in, as argparse puts options);
    -1 where it has none. A help text that wraps with the flag at a line's start is indented
    further and does not count."""
    found = re.search(rf"^  {re.escape(flag)}\b", text, re.M)
    return found.start() if found else -1


def test_every_setting_is_a_flag_of_run_in_its_section():
    text = help_of("run")
    for name in Settings.model_fields:
        assert flag_of(name) in text, name
    # one group per section, in the declared order
    positions = [text.index(f"\n{title}:\n") for title in SECTIONS.values()]
    assert positions == sorted(positions)
    section_of = {name: field.json_schema_extra["section"] for name, field in Settings.model_fields.items()}
    for name, section in section_of.items():
        start = text.index(f"\n{SECTIONS[section]}:\n")
        later = [text.index(f"\n{t}:\n") for t in SECTIONS.values() if text.index(f"\n{t}:\n") > start]
        assert start < option_line(text, flag_of(name)) < min(later, default=len(text)), name


def test_trial_takes_the_settings_of_one_trial_only():
    text = help_of("trial")
    for name, field in Settings.model_fields.items():
        assert (option_line(text, flag_of(name)) >= 0) == (not field.json_schema_extra["run_only"]), name


def test_help_shows_each_default_once_from_the_field():
    text = " ".join(help_of("run").split())
    assert "(default 5m)" in text and "(default 15m)" in text            # budget, agent_timeout: durations
    assert "(default 2; 0: off)" in text                                 # noise_runs, placed by {default}
    assert "(default 0.1, i.e. 10%; 0: off)" in text                     # sanity_bound
    assert "(default max(2 x budget, budget + 2m))" in text              # timeout: the rule, said once
    assert text.count("(default 5)") == 2                                # the two failure limits


def test_flags_become_the_settings_they_name(tmp_path):
    args = build_parser().parse_args(["run", "-C", str(tmp_path), "--budget", "90s", "--max-trials", "3",
                                      "--slurm-option", "account=a", "--slurm-option", "mem=8G", "--isolate",
                                      "--devices", "0,1", "--workers", "2"])
    s = settings_from(args)
    assert (s.budget, s.max_trials, s.isolate, s.devices, s.workers) == (90.0, 3, True, [0, 1], 2)
    assert s.slurm_options == {"account": "a", "mem": "8G"}
    assert s.tag is None and s.noise_runs == 2                           # not given: the defaults


def test_a_negated_flag_overrides_the_config_file(tmp_path):
    (tmp_path / "autoloop.toml").write_text("isolate = true\nremeasure = true\n")
    on = settings_from(build_parser().parse_args(["run", "-C", str(tmp_path)]))
    off = settings_from(build_parser().parse_args(["run", "-C", str(tmp_path), "--no-isolate"]))
    assert (on.isolate, on.remeasure) == (True, True) and (off.isolate, off.remeasure) == (False, True)


@pytest.mark.parametrize("flags, message", [
    (["--workers", "0"], "autoloop: --workers: must be at least 1, got 0"),
    (["--max-trials", "x"], "autoloop: --max-trials: must be a whole number, got 'x'"),
    (["--noise-z", "-1"], "autoloop: --noise-z: must be positive, got -1"),
    (["--isolate", "--budget", "0"], "autoloop: --budget: must be positive, got '0'"),
    (["--slurm-option", "mem=1G", "--slurm-time-limit", "1s"],
     "autoloop: --slurm-time-limit: must be longer than the trial timeout (10m), got 1s"),
])
def test_bad_flag_values_are_one_line_errors(tmp_path, flags, message):
    proc = subprocess.run([sys.executable, "-m", "autoloop.cli", "run", "-C", str(tmp_path), *flags],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip() == message, proc.stderr
