"""Settings: durations, config files, CLI overrides and one-line errors."""

from __future__ import annotations

import sys

import pytest
from pydantic import ValidationError

from autoloop.config.loading import ConfigError, load_settings
from autoloop.config.settings import Settings, date_tag, format_duration, parse_duration


def load(tmp_path, own: str | None = None, pyproject: str | None = None, **overrides) -> Settings:
    if own is not None:
        (tmp_path / "autoloop.toml").write_text(own)
    if pyproject is not None:
        (tmp_path / "pyproject.toml").write_text(pyproject)
    return load_settings(tmp_path, overrides)


def error(tmp_path, own=None, pyproject=None, **overrides) -> str:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, own, pyproject, **overrides)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------------------------------------
# durations


@pytest.mark.parametrize("text, seconds", [
    (300, 300.0), (90.5, 90.5), ("300", 300.0), ("2.5", 2.5), ("300s", 300.0), ("5m", 300.0),
    ("1h", 3600.0), ("1h30m", 5400.0), ("1h30m15s", 5415.0), ("2m30s", 150.0), ("1.5h", 5400.0),
    (" 5m ", 300.0), ("1h 30m", 5400.0), ("5M", 300.0), ("0.5s", 0.5),
])
def test_parse_duration_valid(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", [
    "5 minutes", "", "  ", "abc", "5x", "1h30", "30m1h", "m", "5mm", "inf", "nan", "1e3s",
    True, None, [5], float("inf"),
])
def test_parse_duration_garbage(text):
    with pytest.raises(ConfigError, match="as a duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", [0, -5, "0", "0s", "-5", "-1.5", 0.0])
def test_parse_duration_rejects_zero_and_negative(text):
    with pytest.raises(ConfigError, match="must be positive"):
        parse_duration(text)


@pytest.mark.parametrize("seconds, text", [
    (300, "5m"), (5400, "1h30m"), (45, "45s"), (90, "1m30s"), (3600, "1h"), (3661, "1h1m1s"),
    (0.5, "0.5s"), (0, "0s"), (299.6, "5m"),
])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_format_then_parse_round_trips():
    for s in (45, 300, 5400, 5415, 86400):
        assert parse_duration(format_duration(s)) == s


# ---------------------------------------------------------------------------------------------
# defaults and derived values


def test_defaults_without_any_config(tmp_path):
    s = load(tmp_path)
    assert s.budget == 300 and s.timeout is None and s.timeout_s == 600
    assert s.proposer == "auto" and s.target == "train.py" and s.metric == "val_bpb"
    assert s.direction == "min" and s.min_delta == 0 and s.seed == 42
    assert s.agent_timeout == 900 and s.max_fix_attempts == 2 and s.max_agent_failures == 5
    assert s.max_proposer_failures == 5 and s.queue_dir == "results/queue"
    assert s.command_argv == [sys.executable, "train.py"]
    assert s.run_tag == date_tag() and s.branch == f"autoloop/{date_tag()}"
    assert s.source is None


def test_timeout_default_is_max_of_twice_budget_and_budget_plus_120(tmp_path):
    assert load(tmp_path, budget="30s").timeout_s == 150        # budget + 120
    assert load(tmp_path, budget="10m").timeout_s == 1200       # 2 x budget
    assert load(tmp_path, budget="10m", timeout="15m").timeout_s == 900


def test_command_is_split_like_a_shell(tmp_path):
    s = load(tmp_path, own='command = "uv run \'my train.py\' --fast"')
    assert s.command_argv == ["uv", "run", "my train.py", "--fast"]
    s = load(tmp_path, own='command = ["python", "-u", "train.py"]')
    assert s.command_argv == ["python", "-u", "train.py"]


def test_target_is_normalised(tmp_path):
    assert load(tmp_path, target="./src/train.py").target == "src/train.py"


def test_date_tag_format():
    assert date_tag(0.0).isalnum() and date_tag(0.0)[:3] in ("dec", "jan")


def test_device_auto_means_none(tmp_path):
    assert load(tmp_path, device="auto").device is None
    assert load(tmp_path, device="cuda:1").device == "cuda:1"


# ---------------------------------------------------------------------------------------------
# files and overrides


def test_loads_pyproject_tool_table(tmp_path):
    s = load(tmp_path, pyproject='[project]\nname = "x"\n\n[tool.autoloop]\nbudget = "2m"\n'
                                 'max-trials = 10\ndirection = "max"\n')
    assert (s.budget, s.max_trials, s.direction) == (120, 10, "max")
    assert s.source == "pyproject.toml [tool.autoloop]"


def test_loads_autoloop_toml_top_level(tmp_path):
    s = load(tmp_path, own='budget = 60\nmetric = "loss"\nmin_delta = 0.001\nresume = true\n',
             pyproject='[project]\nname = "x"\n')
    assert (s.budget, s.metric, s.min_delta, s.resume) == (60, "loss", 0.001, True)
    assert s.source == "autoloop.toml"


def test_settings_in_both_files_is_an_error(tmp_path):
    msg = error(tmp_path, own="budget = 60\n", pyproject="[tool.autoloop]\nbudget = 90\n")
    assert "autoloop.toml" in msg and "pyproject.toml" in msg


def test_empty_autoloop_toml_defers_to_pyproject(tmp_path):
    assert load(tmp_path, own="# nothing yet\n", pyproject="[tool.autoloop]\nbudget = 90\n").budget == 90


def test_cli_overrides_win_and_none_means_not_given(tmp_path):
    s = load(tmp_path, own='budget = "5m"\nseed = 1\nproposer = "mutate"\n',
             budget="1m", seed=None, proposer="queue", max_trials=3)
    assert (s.budget, s.seed, s.proposer, s.max_trials) == (60, 1, "queue", 3)


def test_cli_override_keys_may_use_dashes(tmp_path):
    assert load_settings(tmp_path, {"max-trials": 4}).max_trials == 4


# ---------------------------------------------------------------------------------------------
# errors: one line, naming where the bad value came from


def test_unknown_key_with_suggestion(tmp_path):
    assert error(tmp_path, pyproject="[tool.autoloop]\nbugdet = 300\n") == \
        "pyproject.toml [tool.autoloop]: unknown setting 'bugdet' (did you mean 'budget'?)"
    other = tmp_path / "other"
    other.mkdir()
    assert error(other, own="max-trails = 3\n") == \
        "autoloop.toml: unknown setting 'max-trails' (did you mean 'max-trials'?)"


def test_unknown_key_without_suggestion(tmp_path):
    assert error(tmp_path, own="zzzz = 1\n") == "autoloop.toml: unknown setting 'zzzz'"


def test_unknown_cli_override(tmp_path):
    assert error(tmp_path, bugdet=5) == "--bugdet: unknown setting (did you mean '--budget'?)"


def test_bad_duration_from_cli(tmp_path):
    assert error(tmp_path, budget="5 minutes") == \
        "--budget: cannot read '5 minutes' as a duration (use 300, 300s, 5m or 1h30m)"


def test_non_positive_duration_from_file(tmp_path):
    assert error(tmp_path, own="budget = 0\n") == "autoloop.toml: budget: must be positive, got 0"


@pytest.mark.parametrize("toml, expected", [
    ("budget = true", "autoloop.toml: budget: must be a number, got true"),
    ("max_trials = 0", "autoloop.toml: max_trials: must be at least 1, got 0"),
    ("max_trials = 1.5", "autoloop.toml: max_trials: must be a whole number, got 1.5"),
    ("max_trials = true", "autoloop.toml: max_trials: must be a number, got true"),
    ("seed = 'x'", "autoloop.toml: seed: must be a whole number, got 'x'"),
    ("hours = -1", "autoloop.toml: hours: must be positive, got -1"),
    ("hours = 'lots'", "autoloop.toml: hours: must be a number, got 'lots'"),
    ("min_delta = -0.1", "autoloop.toml: min_delta: must be at least 0, got -0.1"),
    ("max_fix_attempts = -1", "autoloop.toml: max_fix_attempts: must be at least 0, got -1"),
    ("max_rss_gb = 0", "autoloop.toml: max_rss_gb: must be positive, got 0"),
    ("direction = 'up'", "autoloop.toml: direction: must be 'min' or 'max', got 'up'"),
    ("proposer = 'human'", "autoloop.toml: proposer: must be 'auto', 'queue', 'mutate', 'agent', 'optuna', "
                           "'portfolio' or 'combine', got 'human'"),
    ("resume = 'maybe'", "autoloop.toml: resume: must be true or false, got 'maybe'"),
    ("corpus = 5", "autoloop.toml: corpus: must be a string, got 5"),
    ("agent = {x = 1}", "autoloop.toml: agent: must be a string, got a table"),
])
def test_bad_values(tmp_path, toml, expected):
    assert error(tmp_path, own=toml + "\n") == expected


@pytest.mark.parametrize("toml, fragment", [
    ("metric = 'val bpb'", "metric: must be a name"),
    ("metric = '1bpb'", "metric: must be a name"),
    ("tag = 'a..b'", "tag: must be"),
    ("tag = 'my tag'", "tag: must be"),
    ("tag = '-x'", "tag: must be"),
    ("tag = 'x.lock'", "tag: must be"),
    ("target = '../train.py'", "target: must stay inside the repository"),
    ("target = '/abs/train.py'", "target: must be a path relative"),
    ("target = ''", "target: must name a file"),
    ("command = \"python 'x\"", "command: cannot split"),
    ("command = ''", "command: must not be empty"),
    ("device = 'gpu'", "device: must be cpu, cuda, cuda:N, mps or auto"),
    ("agent_timeout = '0s'", "agent_timeout: must be positive"),
    ("timeout = 'soon'", "timeout: cannot read 'soon' as a duration"),
])
def test_bad_values_named(tmp_path, toml, fragment):
    msg = error(tmp_path, own=toml + "\n")
    assert msg.startswith("autoloop.toml: ") and fragment in msg


def test_valid_tags(tmp_path):
    for tag in ("nov29", "exp-1.lr_sweep", "A_b"):
        assert load(tmp_path, tag=tag).run_tag == tag


def test_timeout_must_exceed_budget(tmp_path):
    assert error(tmp_path, own='budget = "5m"\ntimeout = "2m"\n') == \
        "autoloop.toml: timeout: must be longer than the budget (5m), got 2m"
    # named after where the timeout came from
    assert error(tmp_path, own='budget = "5m"\n', timeout="5m").startswith("--timeout: ")


def test_dashed_key_error_uses_the_users_spelling(tmp_path):
    assert error(tmp_path, pyproject="[tool.autoloop]\nmax-trials = 0\n") == \
        "pyproject.toml [tool.autoloop]: max-trials: must be at least 1, got 0"


def test_key_given_twice(tmp_path):
    assert "given twice" in error(tmp_path, own="max_trials = 1\nmax-trials = 2\n")


def test_invalid_toml(tmp_path):
    msg = error(tmp_path, own="budget = [1\n")
    assert msg.startswith("autoloop.toml: invalid TOML: ")
    other = tmp_path / "other"
    other.mkdir()
    msg = error(other, pyproject="[tool.autoloop\n")
    assert msg.startswith("pyproject.toml: invalid TOML: ")


def test_tool_autoloop_must_be_a_table(tmp_path):
    assert "must be a table" in error(tmp_path, pyproject="[tool]\nautoloop = 5\n")


def test_settings_model_forbids_extra_fields():
    with pytest.raises(ValidationError):
        Settings(bugdet=1)
