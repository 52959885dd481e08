"""The agent presets end to end: the real CLI against stand-ins named like the real agent
CLIs (tests/fake_clis/), first on a PATH of the test's own.

Each failure seen with the real CLIs (presets.py's docstring) is reproduced by its
stand-in; the preflight stops the ones it can see before the baseline, the output watch
ends the others as soon as the CLI shows them, and every reason names what to do. The
trials are the fast scripted train.py of test_workers.py (metric on stdout): the model is
not under test here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers.git import git, init_repo, private_copy
from helpers.loop import BUDGET, SLOW, autoloop, read_ledger
from test_workers import check_worker_invariants, fake

FAKE_CLIS = Path(__file__).resolve().parent / "fake_clis"
FAKE_AGENTS = Path(__file__).resolve().parent / "fake_agents"
# Credentials a developer's or CI machine may have: blanked, so that only the test decides.
CREDENTIALS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "CODEX_API_KEY", "CODEX_ACCESS_TOKEN", "GEMINI_API_KEY",
               "GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_USE_GCA", "GOOGLE_GEMINI_BASE_URL",
               "OPENROUTER_API_KEY", "DEEPSEEK_API_KEY", "AIDER_MODEL", "IS_SANDBOX", "GEMINI_CLI_TRUST_WORKSPACE",
               "FAKE_CODEX_LOGGED_IN", "FAKE_CLI_OFFLINE")
# What the stand-in agents set in train.py (the scripted one: val_bpb = A + B).
EDIT = "A=0.5"


def tool_path(bin_dir: Path, *first: Path) -> str:
    """A PATH of these folders, then one holding only git and python3 (the stand-ins'
    interpreter): no real agent CLI can be found on it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, target in (("git", shutil.which("git")), ("python3", sys.executable)):
        if not (bin_dir / name).exists():
            (bin_dir / name).symlink_to(target)
    return os.pathsep.join([*map(str, first), str(bin_dir)])


def cli_env(tmp_path: Path, clis: bool = True, **extra: str) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {name: "" for name in CREDENTIALS}
    env.update(PATH=tool_path(tmp_path / "bin", *([FAKE_CLIS] if clis else [])), HOME=str(home),
               FAKE_CLI_RECORD=str(tmp_path / "calls.jsonl"), FAKE_CLI_EDIT=EDIT)
    env.update(extra)
    return env


def calls(tmp_path: Path) -> list[dict]:
    path = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def root_prefix() -> list[str] | None:
    """How to run a command as (namespace) root: [] as root, `unshare -r` where user
    namespaces allow it, None where neither (the root cases are skipped)."""
    if os.geteuid() == 0:
        return []
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-r", "true"], capture_output=True, check=False).returncode == 0:
        return [unshare, "-r"]
    return None


@pytest.fixture(scope="session")
def scripted_template(tmp_path_factory, tiny_data_dir) -> Path:
    """A repo whose baseline (the scripted train.py, val_bpb 2.0) is recorded on autoloop/t."""
    folder = tmp_path_factory.mktemp("scripted")
    repo = init_repo(folder / "repo", {"train.py": fake()})
    proc = autoloop(repo, *night("--proposer", "queue", resume=False), data_dir=tiny_data_dir, env=cli_env(folder))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return repo


@pytest.fixture
def scripted_repo(scripted_template, tmp_path) -> Path:
    """A private copy of scripted_template."""
    return private_copy(scripted_template, tmp_path)


def night(*extra: str, resume: bool = True) -> list[str]:
    return ["run", "--budget", "1", "--timeout", "60", "--tag", "t", "--device", "cpu",
            "--command", f"{sys.executable} train.py", *(["--resume"] if resume else []), *extra]


# ------------------------------------------------------------------------------ preflight


@pytest.mark.parametrize("agent,extra,message", [
    ("claude", {"IS_SANDBOX": "1"}, "preflight: claude auth: not logged in (`claude auth status`); set "
                                    "ANTHROPIC_API_KEY, or log in once with `claude`"),
    ("codex", {}, "preflight: codex auth: not logged in (`codex login status`: Not logged in) and none of "
                  "CODEX_API_KEY, OPENAI_API_KEY, CODEX_ACCESS_TOKEN is set"),
    ("gemini", {}, "preflight: gemini auth: no auth method: none of GEMINI_API_KEY, GOOGLE_GENAI_USE_VERTEXAI"),
    ("aider", {}, "preflight: aider model: no model or API key configured: aider would ask to log in to "
                  "OpenRouter and wait 5 minutes for a browser on every call"),
])
def test_a_failed_preflight_is_one_line_before_the_baseline(tmp_path, tiny_data_dir, agent, extra, message):
    repo = init_repo(tmp_path / "repo", {"train.py": SLOW})
    started = time.monotonic()
    proc = autoloop(repo, "run", "--agent", agent, "--budget", BUDGET, data_dir=tiny_data_dir,
                    env=cli_env(tmp_path, **extra))
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("autoloop: " + message), proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.rstrip().endswith(
        "nothing was run (--skip-preflight starts anyway)")
    assert f"preset {agent}" in proc.stdout
    # Nothing trained, nothing was recorded, the agent itself was never given a prompt.
    assert not (repo / "results" / "ledger.jsonl").exists() and not (repo / "results" / "runs").exists()
    assert all(not any(a in ("-p", "exec", "--message-file") for a in c["argv"]) for c in calls(tmp_path))
    assert elapsed < 60    # seconds of checks, where the baseline alone is a minute on a GPU


def test_a_portfolio_with_an_agent_runs_its_preflight(tmp_path, tiny_data_dir):
    """The portfolio calls the agent too: an agent that cannot run stops it before the baseline."""
    repo = init_repo(tmp_path / "repo", {"train.py": SLOW})
    proc = autoloop(repo, "run", "--portfolio", "agent,mutate", "--agent", "gemini", "--budget", BUDGET,
                    data_dir=tiny_data_dir, env=cli_env(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("autoloop: preflight: gemini auth: no auth method"), proc.stderr
    assert not (repo / "results" / "ledger.jsonl").exists()


def test_claude_as_root_fails_the_preflight(tmp_path, tiny_data_dir):
    prefix = root_prefix()
    if prefix is None:
        pytest.skip("needs root or unprivileged user namespaces (unshare -r)")
    repo = init_repo(tmp_path / "repo", {"train.py": SLOW})
    env = {**os.environ, **cli_env(tmp_path, ANTHROPIC_API_KEY="sk-ant-test"), "AUTOLOOP_DATA_DIR": str(tiny_data_dir)}
    proc = subprocess.run([*prefix, sys.executable, "-m", "autoloop.cli", "run", "--agent", "claude", "--budget",
                           BUDGET], cwd=repo, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("autoloop: preflight: claude as root: Claude Code refuses "
                                  "--dangerously-skip-permissions as root; run autoloop as a normal user, or set "
                                  "IS_SANDBOX=1"), proc.stderr
    assert not (repo / "results" / "ledger.jsonl").exists()


def test_skip_preflight_starts_anyway(scripted_repo, tmp_path, tiny_data_dir):
    proc = autoloop(scripted_repo, *night("--agent", "gemini", "--skip-preflight", "--max-agent-failures", "1"),
                    data_dir=tiny_data_dir, env=cli_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "preflight" not in proc.stdout
    skip = read_ledger(scripted_repo)[-1]
    assert skip["status"] == "skip" and skip["reason"].startswith(
        "Gemini CLI: no authentication configured; set GEMINI_API_KEY")


# ------------------------------------------------------------------------------ during the night


NIGHT_CASES = {
    # The flags of an old preset: gemini's untrusted-folder refusal, exit 55, whose message
    # names the variable to set at its end (a 200-character cut lost it).
    "gemini-untrusted-exit-55": (["--agent-cmd", "gemini --yolo -p 'do the task'"], {"GEMINI_API_KEY": "g-key"},
                                 "Gemini CLI: refuses an untrusted folder; add --skip-trust to the command or set "
                                 "GEMINI_CLI_TRUST_WORKSPACE=true (ended at once): Gemini CLI is not running in a "
                                 "trusted directory. To proceed, either use `--skip-trust`, set the "
                                 "`GEMINI_CLI_TRUST_WORKSPACE=true` environment variable"),
    # Without a model, --yes-always accepts the OpenRouter login and it waits 5 minutes.
    "aider-browser-wait": (["--agent", "aider", "--skip-preflight"], {},
                           "Aider: no model or API key configured (it would wait up to 5 minutes for an "
                           "OpenRouter login in a browser); set ANTHROPIC_API_KEY"),
    # A key, no network: reconnects forever.
    "codex-reconnect-loop": (["--agent", "codex", "--agent-stall-timeout", "3s"],
                             {"CODEX_API_KEY": "c-key", "FAKE_CLI_OFFLINE": "1"},
                             "Codex CLI kept retrying for "),
    "gemini-retry-loop": (["--agent", "gemini", "--agent-stall-timeout", "3s"],
                          {"GEMINI_API_KEY": "g-key", "FAKE_CLI_OFFLINE": "1"}, "Gemini CLI kept retrying for "),
    # Exit 0 after an authentication error.
    "aider-auth-error-exit-0": (["--agent-cmd", "aider --model sonnet --yes-always --no-pretty --map-tokens 0 "
                                                "--chat-history-file {results_dir}/agents/h.md "
                                                "--message-file {prompt_file} {target}"], {},
                                "Aider: authentication failed; check the model's API key (ended at once): "
                                "litellm.AuthenticationError: Missing Anthropic API Key"),
    # Exit 0, no change, offline: the CLI's last error is the reason.
    "aider-offline-exit-0": (["--agent", "aider"], {"ANTHROPIC_API_KEY": "a-key", "FAKE_CLI_OFFLINE": "1"},
                             "agent made no change to train.py: litellm.InternalServerError: AnthropicException"),
    "claude-not-logged-in": (["--agent", "claude", "--skip-preflight"], {"IS_SANDBOX": "1"},
                             "Claude Code: not logged in; set ANTHROPIC_API_KEY, or log in once with `claude` (ended "
                             "at once): Not logged in · Please run /login"),
}


@pytest.mark.parametrize("case", list(NIGHT_CASES))
def test_known_failures_end_the_call_at_once_with_a_useful_reason(scripted_repo, tmp_path, tiny_data_dir, case):
    flags, extra, reason = NIGHT_CASES[case]
    started = time.monotonic()
    proc = autoloop(scripted_repo, *night(*flags, "--agent-timeout", "5m", "--max-agent-failures", "1"),
                    data_dir=tiny_data_dir, env=cli_env(tmp_path, **extra))
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    skip = read_ledger(scripted_repo)[-1]
    assert skip["status"] == "skip" and skip["reason"].startswith(reason), skip["reason"]
    assert skip["reason"].endswith("(see results/agents/1-1.log)") and len(skip["reason"]) <= 500
    assert "agent failed 1 time in a row (--max-agent-failures 1); last: " in proc.stdout
    # Ended long before the 5-minute agent timeout (or aider's 5-minute browser wait).
    assert elapsed < 90, elapsed
    (call,) = [c for c in calls(tmp_path) if "--version" not in c["argv"] and c["argv"][:2] != ["auth", "status"]
               and c["argv"][:2] != ["login", "status"]]
    # Nothing the CLI left in the repository (aider's files), a clean tree on the best.
    assert git(scripted_repo, "status", "--porcelain", "--ignored", "--", ".", ":!results") == ""
    assert git(scripted_repo, "rev-parse", "HEAD") == read_ledger(scripted_repo)[0]["commit"]
    assert call["cwd"] == str(scripted_repo)


def test_the_untrusted_folder_reason_is_kept_whole_and_shortened_only_on_screen(scripted_repo, tmp_path,
                                                                                tiny_data_dir):
    flags, extra, _ = NIGHT_CASES["gemini-untrusted-exit-55"]
    proc = autoloop(scripted_repo, *night(*flags, "--max-agent-failures", "1"), data_dir=tiny_data_dir,
                    env=cli_env(tmp_path, **extra))
    reason = read_ledger(scripted_repo)[-1]["reason"]
    assert len(reason) > 300 and "#headless-and-automated-environments" in reason   # the CLI's whole line
    shown = next(line for line in proc.stdout.splitlines() if "#1 skipped:" in line)
    assert len(shown.split("#1 skipped: ", 1)[1]) <= 240 and shown.endswith("(see results/agents/1-1.log)")
    assert "preflight: warning: gemini trust: the command has no --skip-trust" in proc.stdout


def test_a_browser_wait_leaves_no_process_behind(scripted_repo, tmp_path, tiny_data_dir):
    flags, extra, _ = NIGHT_CASES["aider-browser-wait"]
    autoloop(scripted_repo, *night(*flags, "--max-agent-failures", "1"), data_dir=tiny_data_dir,
             env=cli_env(tmp_path, **extra), check=True)
    for proc in psutil.process_iter(["cmdline"]):
        assert str(FAKE_CLIS / "aider") not in (proc.info["cmdline"] or []), proc


# ------------------------------------------------------------------------------ presets that work


@pytest.mark.parametrize("agent,extra", [
    ("claude", {"ANTHROPIC_API_KEY": "sk-ant-secret-0123456789", "IS_SANDBOX": "1"}),
    ("codex", {"CODEX_API_KEY": "sk-codex-secret-0123456789"}),
    ("gemini", {"GEMINI_API_KEY": "gemini-secret-0123456789"}),
    ("aider", {"ANTHROPIC_API_KEY": "sk-ant-secret-0123456789"}),
])
def test_each_preset_proposes_through_its_cli_and_no_secret_is_recorded(scripted_repo, tmp_path, tiny_data_dir,
                                                                         agent, extra):
    proc = autoloop(scripted_repo, *night("--agent", agent, "--max-trials", "1"), data_dir=tiny_data_dir,
                    env=cli_env(tmp_path, **extra))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trial = read_ledger(scripted_repo)[-1]
    assert (trial["proposer"], trial["status"], trial["description"]) == \
        ("agent", "keep", f"raise the learning rates ({agent})")
    assert "A = 0.5" in git(scripted_repo, "show", f"{trial['commit']}:train.py")
    assert "preflight ok: " in proc.stdout
    assert trial["outside_changes"] == [] and not (scripted_repo / "results" / "quarantine").exists()
    (call,) = [c for c in calls(tmp_path) if c["env"].get("AUTOLOOP_TRIAL")]
    if agent == "claude":
        assert call["env"]["DISABLE_AUTOUPDATER"] == "1"     # the preset's environment
    else:
        assert "DISABLE_AUTOUPDATER" not in call["env"]
    # #17: what the call cost, as the CLI reported it (claude's JSON result, codex's
    # turn.completed); gemini's stand-in prints nothing of the kind (nor does the real one
    # without --output-format json) and aider's stand-in no usage line: said once, never estimated.
    usage = trial["extra"]["agent_usage"]
    if agent == "claude":
        assert usage["cost_usd"] == 0.0421 and usage["output_tokens"] == 321 and usage["reported_by"] == \
            "claude json result"
    elif agent == "codex":
        assert usage == {"input_tokens": 2400, "output_tokens": 150, "cached_tokens": 1200,
                         "reported_by": "codex turn.completed"}
    else:
        assert usage is None
    # The secret is nowhere: not on screen, not in the ledger, state, prompt or logs.
    secret = next(iter(extra.values()))
    assert secret not in proc.stdout + proc.stderr
    for path in (scripted_repo / "results").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert git(scripted_repo, "status", "--porcelain", "--ignored", "--", ".", ":!results") == ""


@pytest.mark.parametrize("agent,extra", [
    ("codex", {"CODEX_API_KEY": "c-key"}),      # --add-dir: the results folder writable in its sandbox
    ("gemini", {"GEMINI_API_KEY": "g-key"}),    # --include-directories: inside its file tools' workspace
])
def test_with_workers_the_agent_can_write_to_the_results_folder(tmp_path, tiny_data_dir, agent, extra):
    """A worker's worktree (worktrees/w<k>) does not contain results/: without the preset's
    extra folder the CLI could not write the description file there."""
    repo = init_repo(tmp_path / "repo", {"train.py": fake()})
    proc = autoloop(repo, *night("--agent", agent, "--workers", "2", "--max-trials", "2", resume=False),
                    data_dir=tiny_data_dir, env=cli_env(tmp_path, **extra))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = check_worker_invariants(repo, None)
    agent_calls = [c for c in calls(tmp_path) if c["env"].get("AUTOLOOP_TRIAL")]
    assert agent_calls and all("/worktrees/w" in c["cwd"] for c in agent_calls)
    assert str(repo / "results") in " ".join(agent_calls[0]["argv"])
    described = [r for r in ledger[1:] if r["description"] == f"raise the learning rates ({agent})"]
    assert described, [r["description"] for r in ledger]


# ------------------------------------------------------------------------------ counting


def test_max_trials_counts_skipped_proposals(scripted_repo, tmp_path, tiny_data_dir):
    proc = autoloop(scripted_repo, *night("--agent-cmd", str(FAKE_AGENTS / "fail.py"), "--max-trials", "3",
                                          "--max-agent-failures", "5"), data_dir=tiny_data_dir, env=cli_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    skips = read_ledger(scripted_repo)[1:]
    assert [(r["trial"], r["status"]) for r in skips] == [(1, "skip"), (2, "skip"), (3, "skip")]
    assert "stopped: reached --max-trials 3" in proc.stdout
