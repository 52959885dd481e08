"""`autoloop mcp --install claude|codex|gemini` and `autoloop init --install ...`: the coding
agent's own project configuration, so that it starts `autoloop mcp` in this repository and
knows how a night is run (docs/agents.md).

Each client's file is the one its documentation names for a project (not the user's home):

- Claude Code: ``.mcp.json`` ``{"mcpServers": {name: {"type": "stdio", "command", "args", "env"}}}``
  and a skill, ``.claude/skills/autoloop/SKILL.md`` (YAML front matter: name, description).
- Codex: ``.codex/config.toml`` ``[mcp_servers.<name>]`` command/args (read in trusted projects),
  and a section of ``AGENTS.md`` between two marker comments.
- Gemini CLI: ``.gemini/settings.json`` ``{"mcpServers": {name: {"command", "args", "trust"}}}``.

Existing files are kept: other servers and settings stay, our entry is added or replaced;
a file that does not parse is refused with its name, never overwritten.
"""

from __future__ import annotations

import json
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from autoloop.core.errors import AutoloopError

if sys.version_info >= (3, 11):
    import tomllib
else:   # Python 3.10
    import tomli as tomllib

CLIENTS = ("claude", "codex", "gemini")
SERVER = "autoloop"
SKILL_DESCRIPTION = ("Start, watch, steer and review an autoloop night of ML experiments in this repository "
                     "(autoloop run, status, attempts, note, queue_patch, report, verify).")
BEGIN, END = "<!-- autoloop:begin -->", "<!-- autoloop:end -->"


class InstallError(AutoloopError):
    """A client configuration that cannot be written (one line)."""


def skill_body() -> str:
    return resources.files("autoloop").joinpath("templates", "agent-skill.md").read_text()


def server_command(allow_write: bool) -> tuple[str, list[str]]:
    """How the client starts the server: the console script, in the repository (the client's cwd)."""
    return "autoloop", ["mcp", *(["--allow-write"] if allow_write else [])]


def _json_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, ValueError) as e:
        raise InstallError(f"{path} is not JSON ({e}): fix or remove it, then install again") from None
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers", {}), dict):
        raise InstallError(f"{path} is not a JSON object with an mcpServers object: fix it first")
    return data


def _write_servers(path: Path, entry: dict[str, Any]) -> None:
    data = _json_file(path)
    data.setdefault("mcpServers", {})[SERVER] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _claude(root: Path, allow_write: bool) -> list[Path]:
    command, args = server_command(allow_write)
    _write_servers(root / ".mcp.json", {"type": "stdio", "command": command, "args": args, "env": {}})
    skill = root / ".claude" / "skills" / SERVER / "SKILL.md"
    skill.parent.mkdir(parents=True, exist_ok=True)
    skill.write_text(f"---\nname: {SERVER}\ndescription: {json.dumps(SKILL_DESCRIPTION)}\n---\n\n{skill_body()}")
    return [root / ".mcp.json", skill]


def _toml_table(allow_write: bool) -> str:
    command, args = server_command(allow_write)
    # JSON strings of plain ASCII are TOML basic strings.
    return (f"[mcp_servers.{SERVER}]\ncommand = {json.dumps(command)}\n"
            f"args = [{', '.join(json.dumps(a) for a in args)}]\n")


def _codex(root: Path, allow_write: bool) -> list[Path]:
    config = root / ".codex" / "config.toml"
    text = config.read_text() if config.exists() else ""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InstallError(f"{config} is not TOML ({e}): fix or remove it, then install again") from None
    # Our table, replaced where it stands (up to the next table header), else appended.
    table = re.compile(rf"^\[mcp_servers\.{SERVER}\]\n(?:(?!\[).*\n?)*", re.MULTILINE)
    new = _toml_table(allow_write)
    if table.search(text):
        text = table.sub(new, text, count=1)
    else:
        text = (text.rstrip() + "\n\n" if text.strip() else "") + new
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(text)
    agents = root / "AGENTS.md"
    section = f"{BEGIN}\n{skill_body().strip()}\n{END}\n"
    old = agents.read_text() if agents.exists() else ""
    marked = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", re.DOTALL)
    old = marked.sub(lambda _: section, old, count=1) if marked.search(old) else \
        (old.rstrip() + "\n\n" if old.strip() else "") + section
    agents.write_text(old)
    return [config, agents]


def _gemini(root: Path, allow_write: bool) -> list[Path]:
    command, args = server_command(allow_write)
    path = root / ".gemini" / "settings.json"
    _write_servers(path, {"command": command, "args": args, "trust": False})
    return [path]


def install(root: Path, clients: list[str], allow_write: bool = False) -> list[Path]:
    """Write each client's configuration in ``root``; the files written, in order."""
    unknown = [c for c in clients if c not in CLIENTS]
    if unknown:
        raise InstallError(f"no client {', '.join(unknown)}: choose from {', '.join(CLIENTS)}")
    writers = {"claude": _claude, "codex": _codex, "gemini": _gemini}
    written: list[Path] = []
    for client in dict.fromkeys(clients):
        written += writers[client](Path(root), allow_write)
    return written
