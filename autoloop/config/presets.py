"""The coding-agent CLIs autoloop knows: how each runs headless, and how to read its output.

A :class:`Preset` is what autoloop knows about one CLI:

* ``command``: the command template ``--agent NAME`` runs (placeholders as in agent.py),
  checked against the CLI's own ``--help`` of ``checked_version`` (the comments cite the
  flags);
* ``env``: environment the CLI needs for an unattended night, added only where the user's
  environment does not set the variable already;
* ``fatal``: output lines that mean the call cannot succeed (not logged in, untrusted
  folder, waiting for a browser): the call is ended the moment one appears, and its
  reason is the skip's reason;
* ``retry``: the CLI's own retry messages; a call whose CLI keeps retrying for
  ``--agent-stall-timeout`` is ended (codex's endless "Reconnecting...");
* ``explain``: lines that explain a failure after the fact (the skip's reason when the
  CLI exits without a change and without a fatal line).

Patterns match one line of output at a time, escape sequences removed, from its start
(``re.match``): an agent echoing the prompt (codex does), whose results table quotes
earlier reasons in rows starting with ``|``, does not trip them.

A ``--agent-cmd`` whose executable is one of these CLIs gets the same reading of its
output and the same preflight (:func:`preset_for`), whatever flags it passes.

Behaviour observed with the installed CLIs (Claude Code 2.1.197, Codex CLI 0.171.0,
Gemini CLI 0.61.0, Aider 0.86.2) in an ``autoloop init`` repository, prompt on stdin, no
TTY, no network, no credentials:

* claude as root: ``--dangerously-skip-permissions cannot be used with root/sudo
  privileges for security reasons``, exit 1 at once (``IS_SANDBOX=1`` lifts it); not
  logged in: ``Not logged in · Please run /login``, exit 1; a key but no network: silent
  for ~190 s, then ``API Error: Unable to connect to API (ConnectionRefused)``, exit 1.
* codex, not logged in or offline: ``ERROR: Reconnecting... 2/5`` ... ``5/5``, then
  ``ERROR: Reconnecting... waiting for network`` forever, never exiting by itself.
* gemini without ``--skip-trust``: ``Gemini CLI is not running in a trusted directory.
  To proceed, either use `--skip-trust`, set the `GEMINI_CLI_TRUST_WORKSPACE=true`
  environment variable, or trust this directory in interactive mode. ...`` (in red),
  exit 55; without credentials: ``Please set an Auth method in your ... settings.json or
  specify one of the following environment variables before running: GEMINI_API_KEY,
  GOOGLE_GENAI_USE_VERTEXAI, GOOGLE_GENAI_USE_GCA``, exit 41; a key but no network:
  ``Attempt N failed. Retrying with backoff... Error: ...`` for ~285 s, then exit 1.
* aider without a model or key: ``No LLM model was specified and no API keys were
  provided.``, then (``--yes-always`` accepting the OpenRouter login) ``Waiting up to 5
  minutes for you to finish in the browser...``; ``--model sonnet`` without a key:
  ``litellm.AuthenticationError: Missing Anthropic API Key ...`` and exit **0**; a key but
  no network: ``litellm.InternalServerError: ...`` / ``Retrying in N seconds...`` for ~60 s,
  then exit 0 without a change.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# The instruction given on the command line where a CLI wants one besides stdin.
ASK = "Carry out the autoloop task given on stdin (the same text is in {prompt_file})."


@dataclass(frozen=True)
class Fatal:
    """An output line meaning the call cannot succeed, what it means, and what to do."""

    pattern: str       # a regex, matched at the start of a line
    meaning: str       # "not logged in"
    fix: str = ""      # "set ANTHROPIC_API_KEY, or log in once with `claude`"

    def matches(self, line: str) -> bool:
        return re.match(self.pattern, line) is not None


@dataclass(frozen=True)
class JsonText:
    """Where a CLI that prints JSON (for its usage report) puts the text of its messages:
    the field of its events of one type, read as the line ``prefix`` + text, so that the
    fatal, retry and explain patterns written for its plain output still apply."""

    type: str          # the event's "type"
    field: str         # the field holding the message
    prefix: str = ""   # what the plain output put before it ("ERROR: ")


@dataclass(frozen=True)
class Preset:
    name: str                  # --agent NAME
    product: str               # the CLI's own name, for messages
    command: str               # the command template (agent.py's placeholders)
    checked_version: str       # the version whose --help the flags were checked against
    version_args: tuple[str, ...] = ("--version",)
    env: Mapping[str, str] = field(default_factory=dict)
    fatal: tuple[Fatal, ...] = ()
    retry: tuple[str, ...] = ()
    explain: tuple[str, ...] = ()
    json_text: tuple[JsonText, ...] = ()

    def agent_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The preset's variables the user's environment does not already set (theirs win)."""
        environ = os.environ if environ is None else environ
        return {k: v for k, v in self.env.items() if k not in environ}


PRESETS: dict[str, Preset] = {
    "claude": Preset(
        name="claude", product="Claude Code", checked_version="2.1.197",
        # -p/--print: non-interactive, the prompt from stdin; --dangerously-skip-permissions:
        # "Bypass all permission checks" (refused as root unless IS_SANDBOX=1);
        # --add-dir: "Additional directories to allow tool access to": the results folder,
        # outside a worker's worktree with --workers, where the description file goes.
        # --output-format json: "json" (single result), the result carrying total_cost_usd
        # and usage (usage.py); a failure is in it too ("result": "Not logged in · Please
        # run /login", "is_error": true, exit 1, as seen with 2.1.197), read by json_text.
        command="claude -p --dangerously-skip-permissions --output-format json --add-dir {results_dir}",
        # Documented in Claude Code's settings: no self-update in the middle of a night,
        # so that every proposal of the night comes from the same version.
        env={"DISABLE_AUTOUPDATER": "1"},
        fatal=(
            Fatal(r"--dangerously-skip-permissions cannot be used with root",
                  "refuses --dangerously-skip-permissions as root",
                  "run autoloop as a normal user, or set IS_SANDBOX=1 in a container you are prepared "
                  "to give the agent"),
            Fatal(r"Not logged in", "not logged in", "set ANTHROPIC_API_KEY, or log in once with `claude`"),
            Fatal(r"Invalid API key", "the API key was refused", "check ANTHROPIC_API_KEY"),
            Fatal(r"API Error: 401\b", "authentication failed", "check ANTHROPIC_API_KEY or log in again"),
        ),
        explain=(r"API Error: ", r"Error: "),
        json_text=(JsonText("result", "result"),),
    ),
    "codex": Preset(
        name="codex", product="Codex CLI", checked_version="0.171.0",
        # `exec`: "Run Codex non-interactively"; `-`: the prompt from stdin;
        # --sandbox workspace-write: model commands may write the workspace (and /tmp);
        # --add-dir: "Additional directories that should be writable alongside the primary
        # workspace": the results folder, read-only under the sandbox when it lies outside a
        # worker's worktree (--workers); --color never: a log without escape codes.
        # --json: "Print events to stdout as JSONL", among them turn.completed with the
        # turn's token usage (usage.py); its errors become {"type":"error","message":
        # "Reconnecting... 2/5 (...)"} (seen with 0.171.0 offline), read by json_text.
        command="codex exec --json --color never --sandbox workspace-write --add-dir {results_dir} -",
        # Offline or not logged in it never exits (see the module docstring): its
        # reconnect messages are the stall watch's evidence.
        retry=(r"ERROR: Reconnecting\.\.\.",),
        explain=(r"ERROR: ", r"Error: ", r"stream disconnected before completion"),
        json_text=(JsonText("error", "message", "ERROR: "),),
    ),
    "aider": Preset(
        name="aider", product="Aider", checked_version="0.86.2",
        # --message-file: one message, then exit; --yes-always: answer every question yes;
        # --no-auto-commits: autoloop commits; --no-gitignore: leave .gitignore alone;
        # --no-pretty: plain output for the log; --no-check-update, --no-show-release-notes,
        # --no-analytics: nothing to ask and nothing to send on an unattended night;
        # --no-detect-urls: a URL in program.md is not fetched (with --yes-always it would be,
        # installing a browser for it); --map-tokens 0: no repository map, so no
        # .aider.tags.cache.v4/ in the repository (the map is moot: the file is named).
        # Aider's own files go to results/: neither committed nor reverted as outside edits.
        command=("aider --yes-always --no-auto-commits --no-gitignore --no-pretty --no-check-update "
                 "--no-show-release-notes --no-analytics --no-detect-urls --map-tokens 0 "
                 "--chat-history-file {results_dir}/agents/aider.chat.history.md "
                 "--input-history-file {results_dir}/agents/aider.input.history "
                 "--message-file {prompt_file} {target}"),
        fatal=(
            Fatal(r"No LLM model was specified and no API keys were provided",
                  "no model or API key configured (it would wait up to 5 minutes for an OpenRouter login "
                  "in a browser)",
                  "set ANTHROPIC_API_KEY (or another provider's key) or AIDER_MODEL, or `model:` in "
                  ".aider.conf.yml"),
            Fatal(r"Waiting up to 5 minutes for you to finish in the browser",
                  "waits for an OpenRouter login in a browser",
                  "configure a model and its API key (AIDER_MODEL, ANTHROPIC_API_KEY, ...)"),
            Fatal(r"litellm\.AuthenticationError", "authentication failed", "check the model's API key"),
            Fatal(r"The API provider is not able to authenticate you", "authentication failed",
                  "check the model's API key"),
        ),
        explain=(r"litellm\.\w+Error: ", r"Error: "),
    ),
    "gemini": Preset(
        name="gemini", product="Gemini CLI", checked_version="0.61.0",
        # --approval-mode yolo: "auto-approve all tools"; --skip-trust: "Trust the current
        # workspace for this session" (else an untrusted folder overrides the approval mode
        # and the CLI exits 55); --include-directories: "Additional directories to include in
        # the workspace": its file tools refuse paths outside the workspace ("Path not in
        # workspace"), and with --workers the results folder is outside the worktree;
        # -p: headless, the instruction appended to stdin.
        command=f"gemini --approval-mode yolo --skip-trust --include-directories {{results_dir}} -p '{ASK}'",
        fatal=(
            Fatal(r"Gemini CLI is not running in a trusted directory", "refuses an untrusted folder",
                  "add --skip-trust to the command or set GEMINI_CLI_TRUST_WORKSPACE=true"),
            Fatal(r"Please set an Auth method", "no authentication configured",
                  "set GEMINI_API_KEY, or choose an auth method once in `gemini`"),
            Fatal(r"When using Gemini API, you must specify the GEMINI_API_KEY", "GEMINI_API_KEY is missing",
                  "set GEMINI_API_KEY"),
        ),
        retry=(r"Attempt \d+ failed\. Retrying with backoff",),
        explain=(r"An unexpected critical error occurred", r"Error generating content", r"Error: "),
    ),
}


def preset_for(argv0: str) -> Preset | None:
    """The preset of a command's executable (``/usr/bin/claude`` -> claude), or None."""
    return PRESETS.get(os.path.basename(argv0))
