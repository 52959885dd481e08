"""The agent's output watch and preflight checks, unit by unit (the CLI tests are in
test_agent_presets.py)."""

from __future__ import annotations

import json
import threading

import pytest

from autoloop.config.presets import PRESETS, preset_for
from autoloop.config.settings import Settings
from autoloop.observe.console import shorten
from autoloop.proposers.agent_watch import OutputWatch
from autoloop.proposers.preflight import agent_checks


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------------------ the watch


def test_a_fatal_line_trips_the_watch_with_the_cli_line_as_evidence():
    watch = OutputWatch(PRESETS["gemini"])
    watch.feed(b"YOLO mode is enabled. All tool calls will be automatically approved.\n")
    assert not watch.is_set()
    # Split across chunks and coloured, as the real CLI prints it.
    watch.feed(b"\x1b[31mGemini CLI is not running in a trusted directory. To proceed, either use `--skip-")
    assert not watch.is_set()
    watch.feed(b"trust`, set the `GEMINI_CLI_TRUST_WORKSPACE=true` environment variable\x1b[0m\n")
    assert watch.is_set()
    reason = watch.reason()
    assert reason.startswith("Gemini CLI: refuses an untrusted folder; add --skip-trust")
    assert "(ended at once): Gemini CLI is not running in a trusted directory" in reason
    assert "GEMINI_CLI_TRUST_WORKSPACE=true" in reason and "\x1b" not in reason


def test_fatal_patterns_match_from_the_start_of_a_line_only():
    """codex echoes the prompt, whose results table quotes earlier reasons: not evidence."""
    watch = OutputWatch(PRESETS["claude"])
    watch.feed(b"| 3 | skip | - | Claude Code: not logged in (ended at once): "
               b"Not logged in \xc2\xb7 Please run /login |\n"
               b"the model says: I am Not logged in anywhere\n")
    assert not watch.is_set() and watch.reason() is None
    watch.feed(b"Not logged in \xc2\xb7 Please run /login\n")
    assert watch.is_set() and "not logged in" in watch.reason()


def test_a_character_split_between_two_reads_is_kept():
    watch = OutputWatch(PRESETS["claude"])
    line = "Not logged in · Please run /login\n".encode()
    cut = line.index("·".encode()) + 1          # inside the two bytes of '·'
    watch.feed(line[:cut])
    watch.feed(line[cut:])
    assert watch.evidence == "Not logged in · Please run /login"


def test_a_last_line_without_newline_counts_at_the_end():
    watch = OutputWatch(PRESETS["claude"])
    watch.feed(b"--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons")
    assert not watch.is_set()
    watch.finish()
    assert watch.is_set() and "IS_SANDBOX=1" in watch.reason()


def test_retry_messages_trip_the_watch_after_the_stall_timeout():
    clock = Clock()
    watch = OutputWatch(PRESETS["codex"], stall_s=60, clock=clock)
    watch.feed(b"OpenAI Codex v0.171.0\nERROR: Reconnecting... 2/5\n")
    for _ in range(11):                      # 55 s of retrying: not yet
        clock.now += 5
        watch.feed(b"ERROR: Reconnecting... waiting for network\n")
    assert not watch.is_set()
    clock.now += 5
    watch.feed(b"ERROR: Reconnecting... waiting for network\n")
    assert watch.is_set()
    assert watch.reason() == ("Codex CLI kept retrying for 1m (offline, or not logged in?), ended by "
                              "--agent-stall-timeout: ERROR: Reconnecting... waiting for network")


def test_a_retry_that_recovered_starts_a_new_run():
    clock = Clock()
    watch = OutputWatch(PRESETS["gemini"], stall_s=60, clock=clock)
    watch.feed(b"Attempt 1 failed. Retrying with backoff... Error: fetch failed\n")
    clock.now += 61                          # quiet for longer than the stall window: it worked
    watch.feed(b"Attempt 1 failed. Retrying with backoff... Error: fetch failed\n")
    clock.now += 30
    watch.feed(b"Attempt 2 failed. Retrying with backoff... Error: fetch failed\n")
    assert not watch.is_set()
    assert watch.explanation().startswith("Attempt 2 failed")


def test_no_stall_timeout_and_unknown_agents_never_trip():
    clock = Clock()
    off = OutputWatch(PRESETS["codex"], stall_s=None, clock=clock)
    unknown = OutputWatch(None)
    for _ in range(100):
        clock.now += 60
        off.feed(b"ERROR: Reconnecting... waiting for network\n")
        unknown.feed(b"Not logged in \xc2\xb7 Please run /login\n")
    assert not off.is_set() and not unknown.is_set()


def test_the_loops_stop_request_still_counts():
    stop = threading.Event()
    watch = OutputWatch(PRESETS["aider"], stop_event=stop)
    assert not watch.is_set()
    stop.set()
    assert watch.is_set() and watch.reason() is None   # a stop is not the agent's failure


def test_explanation_is_the_last_error_line():
    watch = OutputWatch(PRESETS["aider"])
    watch.feed(b"Aider v0.86.2\nlitellm.InternalServerError: AnthropicException - [Errno -2] Name or service not\n"
               b"known.\nRetrying in 0.2 seconds...\n")
    assert not watch.is_set()
    assert watch.explanation().startswith("litellm.InternalServerError: AnthropicException")


def test_preset_for_a_command_finds_known_clis():
    assert preset_for("/usr/local/bin/claude") is PRESETS["claude"]
    assert preset_for("aider") is PRESETS["aider"]
    assert preset_for("my-agent") is None


def test_shorten_keeps_the_start_and_the_end():
    text = "Gemini CLI: refuses an untrusted folder " + "x" * 400 + " (see results/agents/3-1.log)"
    short = shorten(text, 120)
    assert len(short) <= 120 and short.startswith("Gemini CLI: refuses") and short.endswith("3-1.log)")
    assert shorten("short", 120) == "short"


# ------------------------------------------------------------------------------ preflight


@pytest.fixture
def home(tmp_path):
    path = tmp_path / "home"
    path.mkdir()
    return path


def checks(agent: str, home, environ: dict, workspace, **settings) -> dict[str, tuple[str, str]]:
    """name -> (status, detail) of the preflight with the real stand-in CLIs on PATH."""
    from test_agent_presets import FAKE_CLIS, tool_path

    env = {"PATH": tool_path(workspace.parent / "bin", FAKE_CLIS), "HOME": str(home), **environ}
    found = agent_checks(Settings(agent=agent, **settings), workspace, environ=env, euid=1000)
    return {c.name: (c.status, c.detail) for c in found}


def with_files(tmp_path, home, files: dict[str, str]):
    """The home folder's configuration files written; a workspace folder beside it."""
    for name, text in files.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


@pytest.mark.parametrize("environ,files,status", [
    ({}, {}, "fail"),
    ({"GEMINI_API_KEY": "k"}, {}, "ok"),
    ({"GOOGLE_GENAI_USE_VERTEXAI": "true"}, {}, "ok"),
    ({"GOOGLE_GENAI_USE_VERTEXAI": "false"}, {}, "fail"),
    ({}, {".gemini/settings.json": json.dumps({"security": {"auth": {"selectedType": "oauth-personal"}}})}, "ok"),
    ({}, {".gemini/.env": "GEMINI_API_KEY=abc\n"}, "ok"),
])
def test_gemini_auth_sources(tmp_path, home, environ, files, status):
    assert checks("gemini", home, environ, with_files(tmp_path, home, files))["gemini auth"][0] == status


@pytest.mark.parametrize("environ,files,status", [
    ({}, {}, "fail"),
    ({"ANTHROPIC_API_KEY": "k"}, {}, "ok"),
    ({"AIDER_MODEL": "gpt-4o"}, {}, "ok"),
    ({}, {".env": "OPENAI_API_KEY=sk-x\n"}, "ok"),
    ({}, {".aider.conf.yml": "model: sonnet\n"}, "ok"),
    ({}, {".aider/oauth-keys.env": "OPENROUTER_API_KEY=x\n"}, "ok"),
])
def test_aider_model_sources(tmp_path, home, environ, files, status):
    assert checks("aider", home, environ, with_files(tmp_path, home, files))["aider model"][0] == status


def test_codex_key_in_the_environment_passes_although_login_status_says_no(tmp_path, home):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    assert checks("codex", home, {}, workspace)["codex auth"][0] == "fail"
    found = checks("codex", home, {"CODEX_API_KEY": "sk-secret-codex"}, workspace)
    assert found["codex auth"][0] == "ok" and "CODEX_API_KEY is set" in found["codex auth"][1]
    assert "sk-secret-codex" not in json.dumps(found)
    assert checks("codex", home, {"FAKE_CODEX_LOGGED_IN": "1"}, workspace)["codex auth"][0] == "ok"
    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text('model_provider = "ollama"\n')
    assert checks("codex", home, {}, workspace)["codex auth"][0] == "warn"


def test_claude_root_refusal_is_a_preflight_failure(tmp_path, home):
    from test_agent_presets import FAKE_CLIS, tool_path

    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = {"PATH": tool_path(tmp_path / "bin", FAKE_CLIS), "HOME": str(home), "ANTHROPIC_API_KEY": "sk-ant-x"}
    as_root = {c.name: c.status for c in agent_checks(Settings(agent="claude"), workspace, environ=env, euid=0)}
    assert as_root == {"claude version": "ok", "claude as root": "fail", "claude auth": "ok"}
    sandboxed = agent_checks(Settings(agent="claude"), workspace, environ={**env, "IS_SANDBOX": "1"}, euid=0)
    assert [c.status for c in sandboxed] == ["ok", "ok"]


def test_an_unknown_agent_command_is_only_found(tmp_path):
    found = agent_checks(Settings(agent_cmd="sh -c true"), tmp_path)
    assert [(c.name, c.status) for c in found] == [("agent", "ok")]
    assert "not a known CLI" in found[0].detail
    missing = agent_checks(Settings(agent_cmd="no-such-agent-here"), tmp_path)
    assert [(c.status, c.detail) for c in missing] == [("fail", "agent command not found: no-such-agent-here "
                                                                "(check --agent-cmd)")]


@pytest.mark.parametrize("value,expected", [("90s", 90.0), ("2m", 120.0), (0, 0.0), ("0", 0.0), ("off", 0.0)])
def test_stall_timeout_setting(tmp_path, value, expected):
    from autoloop.config.loading import load_settings

    (tmp_path / "autoloop.toml").write_text(f"agent-stall-timeout = {json.dumps(value)}\nskip-preflight = true\n")
    settings = load_settings(tmp_path)
    assert (settings.agent_stall_timeout, settings.skip_preflight) == (expected, True)


@pytest.mark.parametrize("value,message", [
    ("-5", "--agent-stall-timeout: must be 0 (off) or a duration, got -5"),
    ("soon", "--agent-stall-timeout: cannot read 'soon' as a duration (use 300, 300s, 5m or 1h30m)"),
])
def test_bad_stall_timeout_is_one_line(tmp_path, value, message):
    from autoloop.config.loading import ConfigError, load_settings

    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path, {"agent_stall_timeout": float(value) if value.lstrip("-").isdigit() else value})
    assert str(info.value) == message
