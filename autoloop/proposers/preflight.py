"""The agent's preflight: cheap checks, before the baseline, that the agent can run at all.

Without them a night learns that the agent cannot work only after the baseline (a minute
or more) and then spends each failed call until ``--agent-timeout``. Each check takes at
most seconds and uses no network: the executable and its version, the credentials where
the CLI can tell quickly (``claude auth status``, ``codex login status``) or where they
are documented (environment variables, settings and ``.env`` files the CLI reads), Claude
Code as root, a model for aider. A failed check stops ``autoloop run`` with one line
before anything trains (``--skip-preflight`` for setups these checks do not know);
``autoloop doctor`` prints them all.

What each check says names variables, never their values: nothing secret is printed or
recorded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from autoloop.config.presets import PRESETS, Preset, preset_for
from autoloop.config.settings import Settings
from autoloop.core.checks import Check, fail, failures, ok, warn
from autoloop.observe.console import plural
from autoloop.proposers.agent import (
    AgentSetupError,
    agent_command,
    check_executable,
    split_command,
)
from autoloop.proposers.base import ProposerError

PROBE_TIMEOUT_S = 30.0   # per probe command; a CLI's start-up takes seconds on a loaded machine


class PreflightError(ProposerError):
    """A preflight check failed: the agent cannot run (one line for the user)."""


@dataclass
class Probe:
    """What the checks of one agent command look at."""

    argv: list[str]                 # the agent command, split (placeholders unfilled)
    executable: str                 # resolved path of argv[0]
    preset: Preset | None
    workspace: Path
    environ: Mapping[str, str]
    home: Path
    euid: int

    def run(self, *args: str) -> tuple[int | None, str]:
        """(exit code, stdout + stderr) of the executable with args; (None, why) when it
        could not run or took longer than PROBE_TIMEOUT_S. Stdin is empty: no CLI waits."""
        try:
            out = subprocess.run([self.executable, *args], cwd=self.workspace, env=dict(self.environ),
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                                 timeout=PROBE_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return None, f"no answer within {PROBE_TIMEOUT_S:g} s"
        except OSError as e:
            return None, e.strerror or str(e)
        return out.returncode, (out.stdout + out.stderr).strip()

    def has_flag(self, *flags: str) -> bool:
        return any(arg in flags or arg.split("=", 1)[0] in flags for arg in self.argv[1:])

    def flag_value(self, *flags: str) -> str | None:
        for i, arg in enumerate(self.argv[1:], start=1):
            name, eq, value = arg.partition("=")
            if name in flags:
                return value if eq else (self.argv[i + 1] if i + 1 < len(self.argv) else None)
        return None

    def env_set(self, *names: str) -> list[str]:
        """Which of these variables are set to something (names only)."""
        return [n for n in names if self.environ.get(n, "").strip()]


def agent_checks(settings: Settings, workspace: Path, environ: Mapping[str, str] | None = None,
                 euid: int | None = None) -> list[Check]:
    """Every preflight check of the configured agent, in order; [] when none is configured."""
    if not (settings.agent or settings.agent_cmd):
        return []
    environ = dict(os.environ if environ is None else environ)
    try:
        template, label = agent_command(settings.agent, settings.agent_cmd)
        argv = split_command(template)
        hint = "check --agent-cmd" if label == "--agent-cmd" else "install it or use --agent-cmd"
        executable = check_executable(argv[0], workspace, hint, search_path=environ.get("PATH"))
    except AgentSetupError as e:
        return [fail("agent", str(e))]
    preset = PRESETS.get(label) or preset_for(argv[0])
    probe = Probe(argv, executable, preset, Path(workspace), environ,
                  Path(environ.get("HOME") or Path.home()), os.geteuid() if euid is None else euid)
    checks = [_version(probe)]
    if preset is not None:
        checks += _PRESET_CHECKS[preset.name](probe)
    return checks


def run_preflight(settings: Settings, workspace: Path, say: Callable[[str], None]) -> list[Check]:
    """The preflight of `autoloop run`: warnings said, a failure raised as PreflightError."""
    checks = agent_checks(settings, workspace)
    for check in checks:
        if check.status == "warn":
            say(f"preflight: warning: {check.name}: {check.detail}")
    failed = failures(checks)
    if failed:
        first = failed[0]
        more = (f" (and {plural(len(failed) - 1, 'more failed check')}: autoloop doctor lists them)"
                if len(failed) > 1 else "")
        raise PreflightError(f"preflight: {first.name}: {first.detail}{more}; nothing was run "
                             f"(--skip-preflight starts anyway)")
    if checks:
        say("preflight ok: " + "; ".join(c.detail for c in checks if c.status == "ok"))
    return checks


# ------------------------------------------------------------------------------ every agent


def _version(probe: Probe) -> Check:
    name = probe.preset.name if probe.preset else Path(probe.argv[0]).name
    if probe.preset is None:
        return ok("agent", f"{name} found at {probe.executable} (not a known CLI: no further checks)")
    code, out = probe.run(*probe.preset.version_args)
    first = out.splitlines()[0].strip() if out else ""
    if code != 0 or not first:
        return warn(f"{name} version", f"`{name} {' '.join(probe.preset.version_args)}` did not answer "
                                       f"({first or f'exit {code}'}); found at {probe.executable}")
    checked = probe.preset.checked_version
    note = "" if checked in first else f"; the preset's flags were checked with {checked}"
    return ok(f"{name} version", f"{first[:80]} at {probe.executable}{note}")


# ------------------------------------------------------------------------------ per CLI


def _claude(probe: Probe) -> list[Check]:
    checks = []
    if probe.euid == 0 and probe.has_flag("--dangerously-skip-permissions") \
            and probe.environ.get("IS_SANDBOX") != "1":
        checks.append(fail("claude as root", "Claude Code refuses --dangerously-skip-permissions as root; run "
                                             "autoloop as a normal user, or set IS_SANDBOX=1 in a container you "
                                             "are prepared to give the agent"))
    code, out = probe.run("auth", "status")
    try:
        status = json.loads(out[out.index("{"):out.rindex("}") + 1])
    except ValueError:
        status = None
    if not isinstance(status, dict) or "loggedIn" not in status:
        checks.append(warn("claude auth", f"`claude auth status` gave no answer ({_first_line(out, code)}); "
                                          f"credentials not checked"))
    elif status["loggedIn"]:
        # Only the method and the variable's name: never a value, never an account.
        how = str(status.get("authMethod") or "logged in")
        source = status.get("apiKeySource")
        checks.append(ok("claude auth", f"logged in ({how}" + (f" from {source})" if source else ")")))
    else:
        checks.append(fail("claude auth", "not logged in (`claude auth status`); set ANTHROPIC_API_KEY, or log "
                                          "in once with `claude`"))
    return checks


CODEX_KEYS = ("CODEX_API_KEY", "OPENAI_API_KEY", "CODEX_ACCESS_TOKEN")


def _codex(probe: Probe) -> list[Check]:
    checks = []
    code, out = probe.run("login", "status")
    keys = probe.env_set(*CODEX_KEYS)
    provider = _codex_provider(probe)
    if code == 0:
        checks.append(ok("codex auth", "logged in (`codex login status`)"))
    elif keys:
        # `codex login status` says "Not logged in" with a key in the environment too.
        checks.append(ok("codex auth", f"{keys[0]} is set (`codex login status` does not see keys in the "
                                       f"environment)"))
    elif provider or probe.has_flag("--oss"):
        checks.append(warn("codex auth", f"model provider {provider or 'oss'}: its credentials are not checked"))
    else:
        checks.append(fail("codex auth", f"not logged in (`codex login status`: {_first_line(out, code)}) and "
                                         f"none of {', '.join(CODEX_KEYS)} is set; run `codex login` or set "
                                         f"CODEX_API_KEY (logged out or offline, codex retries forever)"))
    if sys.platform.startswith("linux") and not probe.has_flag("--dangerously-bypass-approvals-and-sandbox") \
            and shutil.which("bwrap", path=probe.environ.get("PATH")) is None:
        checks.append(warn("codex sandbox", "bubblewrap (bwrap) is not on PATH: codex uses its bundled copy "
                                            "and says so in every log (install the bubblewrap package)"))
    return checks


def _codex_provider(probe: Probe) -> str | None:
    """A model_provider other than openai in $CODEX_HOME/config.toml (its own credentials)."""
    home = Path(probe.environ.get("CODEX_HOME") or probe.home / ".codex")
    try:
        text = (home / "config.toml").read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r'^\s*model_provider\s*=\s*"([^"]+)"', text, re.MULTILINE)
    return found.group(1) if found and found.group(1) != "openai" else None


# Gemini CLI 0.61.0 (validateNonInteractiveAuth): an auth type from settings, else from these.
GEMINI_ENV = {"GEMINI_API_KEY": None, "GOOGLE_GEMINI_BASE_URL": None, "GOOGLE_GENAI_USE_VERTEXAI": "true",
              "GOOGLE_GENAI_USE_GCA": "true", "CLOUD_SHELL": "true", "GEMINI_CLI_USE_COMPUTE_ADC": "true"}


def _gemini(probe: Probe) -> list[Check]:
    checks = []
    from_env = [n for n, want in GEMINI_ENV.items()
                if probe.environ.get(n, "").strip() and (want is None or probe.environ[n].strip().lower() == want)]
    settings = [p for p in _gemini_settings(probe) if _mentions(p, r'"selectedType"|"selectedAuthType"')]
    key_line = r"^\s*(export\s+)?GEMINI_API_KEY\s*=\s*\S"
    dotenv = [p for p in _gemini_dotenvs(probe) if _mentions(p, key_line, re.MULTILINE)]
    if from_env:
        checks.append(ok("gemini auth", f"{from_env[0]} is set"))
    elif settings:
        checks.append(ok("gemini auth", f"an auth method is chosen in {settings[0]}"))
    elif dotenv:
        checks.append(ok("gemini auth", f"GEMINI_API_KEY is in {dotenv[0]}"))
    else:
        checks.append(fail("gemini auth", "no auth method: none of GEMINI_API_KEY, GOOGLE_GENAI_USE_VERTEXAI, "
                                          "GOOGLE_GENAI_USE_GCA is set and ~/.gemini/settings.json chooses none; "
                                          "set GEMINI_API_KEY, or choose one once in `gemini`"))
    if not probe.has_flag("--skip-trust") and probe.environ.get("GEMINI_CLI_TRUST_WORKSPACE") != "true":
        checks.append(warn("gemini trust", "the command has no --skip-trust: Gemini CLI refuses a folder it does "
                                           "not trust (exit 55) unless you trusted this one"))
    return checks


def _gemini_settings(probe: Probe) -> list[Path]:
    return [probe.home / ".gemini" / "settings.json", probe.workspace / ".gemini" / "settings.json",
            Path("/etc/gemini-cli/settings.json")]


def _gemini_dotenvs(probe: Probe) -> list[Path]:
    """The .env files Gemini CLI reads: up from the workspace, then the home folder's."""
    found = []
    for folder in (probe.workspace, *probe.workspace.parents):
        found += [folder / ".gemini" / ".env", folder / ".env"]
    return found + [probe.home / ".gemini" / ".env", probe.home / ".env"]


# Aider 0.86.2 (onboarding.try_to_select_default_model): a model from the first key it finds.
AIDER_KEYS = ("OPENROUTER_API_KEY", "ANTHROPIC_API_KEY", "DEEPSEEK_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY",
              "VERTEXAI_PROJECT", "AIDER_MODEL", "AIDER_OPENAI_API_KEY", "AIDER_ANTHROPIC_API_KEY", "AIDER_API_KEY")
# Its model flags (--model and the deprecated shortcuts).
AIDER_MODEL_FLAGS = ("--model", "--opus", "--sonnet", "--haiku", "--4", "-4", "--4o", "--mini", "--4-turbo",
                     "--35turbo", "--35-turbo", "--3", "-3", "--deepseek", "--o1-mini", "--o1-preview")


def _aider(probe: Probe) -> list[Check]:
    if probe.has_flag(*AIDER_MODEL_FLAGS):
        return [ok("aider model", "a model is given on the command line (its API key is not checked)")]
    keys = probe.env_set(*AIDER_KEYS)
    if keys:
        return [ok("aider model", f"{keys[0]} is set")]
    key_line = rf"^\s*(export\s+)?({'|'.join(AIDER_KEYS)})\s*=\s*\S"
    for path in _aider_files(probe, ".env", "--env-file") + [probe.home / ".aider" / "oauth-keys.env"]:
        if _mentions(path, key_line, re.MULTILINE):
            return [ok("aider model", f"a key or model is set in {path}")]
    for path in _aider_files(probe, ".aider.conf.yml", "--config", "-c"):
        if _mentions(path, r"^\s*(model|opus|sonnet|4o|deepseek|api-key|openai-api-key|anthropic-api-key)\s*:",
                     re.MULTILINE):
            return [ok("aider model", f"a model or key is set in {path}")]
    return [fail("aider model", "no model or API key configured: aider would ask to log in to OpenRouter and wait "
                                "5 minutes for a browser on every call; set ANTHROPIC_API_KEY (or another "
                                "provider's key) or AIDER_MODEL, or `model:` in .aider.conf.yml")]


def _aider_files(probe: Probe, name: str, *flags: str) -> list[Path]:
    """Where aider looks for one of its files: home, the git root, the working folder, and
    a file given on the command line."""
    paths = [probe.home / name, probe.workspace / name]
    given = probe.flag_value(*flags)
    return paths + ([probe.workspace / given] if given else [])


_PRESET_CHECKS: dict[str, Callable[[Probe], list[Check]]] = {
    "claude": _claude, "codex": _codex, "gemini": _gemini, "aider": _aider,
}


def _mentions(path: Path, pattern: str, flags: int = 0) -> bool:
    try:
        return re.search(pattern, path.read_text(errors="replace"), flags) is not None
    except OSError:
        return False


def _first_line(out: str, code: int | None) -> str:
    line = out.splitlines()[0].strip() if out.strip() else ""
    return line[:120] or (f"exit {code}" if code is not None else "no answer")
