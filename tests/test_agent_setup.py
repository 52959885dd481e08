"""`autoloop mcp --install` and `autoloop init --install`: each client's files, checked against
the format its documentation gives; `attempts --json`, `status --json` and the verify JSON
against their own schemas; a stop asked for from another shell."""

from __future__ import annotations

import json
import os
import sys

import jsonschema
import pytest
import yaml
from helpers.git import git, init_repo
from helpers.loop import GOOD, autoloop_in_process, queue_file, read_ledger, read_tsv, run_args
from helpers.night import build_night, realistic_steps

from autoloop.core.contributions import Estimate
from autoloop.review.json_forms import schema, verify_payload
from autoloop.review.mcp.client_setup import BEGIN, END, InstallError, install
from autoloop.store.stop_request import request_stop
from autoloop.verification.verify_plan import ChangeVerdict, Plan, Summary

try:
    import tomllib
except ImportError:   # Python 3.10
    import tomli as tomllib

STRINGS = {"type": "array", "items": {"type": "string"}}
ENV = {"type": "object", "additionalProperties": {"type": "string"}}
# Claude Code's project scope: .mcp.json, {"mcpServers": {name: server}}; a stdio server is
# "type": "stdio" (the default), "command", "args", "env" (code.claude.com/docs/en/mcp).
CLAUDE = {"type": "object", "required": ["mcpServers"], "properties": {"mcpServers": {
    "type": "object", "additionalProperties": {
        "type": "object", "required": ["command"], "additionalProperties": False,
        "properties": {"type": {"const": "stdio"}, "command": {"type": "string", "minLength": 1},
                       "args": STRINGS, "env": ENV}}}}}
# Codex: [mcp_servers.<name>] in config.toml (a project's .codex/config.toml in a trusted
# project); a stdio server's keys (developers.openai.com/codex/mcp).
CODEX = {"type": "object", "required": ["mcp_servers"], "properties": {"mcp_servers": {
    "type": "object", "additionalProperties": {
        "type": "object", "required": ["command"], "additionalProperties": False,
        "properties": {"command": {"type": "string", "minLength": 1}, "args": STRINGS, "env": ENV,
                       "env_vars": STRINGS, "cwd": {"type": "string"}, "enabled": {"type": "boolean"},
                       "startup_timeout_sec": {"type": "number"}, "tool_timeout_sec": {"type": "number"},
                       "enabled_tools": STRINGS, "disabled_tools": STRINGS}}}}}
# Gemini CLI: .gemini/settings.json, {"mcpServers": {name: server}} (geminicli.com/docs/tools/mcp-server).
GEMINI = {"type": "object", "required": ["mcpServers"], "properties": {"mcpServers": {
    "type": "object", "additionalProperties": {
        "type": "object", "required": ["command"], "additionalProperties": False,
        "properties": {"command": {"type": "string", "minLength": 1}, "args": STRINGS, "env": ENV,
                       "cwd": {"type": "string"}, "timeout": {"type": "integer"}, "trust": {"type": "boolean"},
                       "includeTools": STRINGS, "excludeTools": STRINGS, "description": {"type": "string"}}}}}}
# A skill: SKILL.md with YAML front matter, a lowercase name and a description the model reads.
SKILL = {"type": "object", "required": ["name", "description"], "properties": {
    "name": {"type": "string", "pattern": "^[a-z0-9-]{1,64}$"},
    "description": {"type": "string", "minLength": 20, "maxLength": 1024}}}


def front_matter(text: str) -> tuple[dict, str]:
    assert text.startswith("---\n")
    head, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(head), body


def test_install_writes_each_clients_documented_format(tmp_path):
    repo = init_repo(tmp_path / "repo")
    (repo / ".mcp.json").write_text(json.dumps({"mcpServers": {"other": {"command": "other-server"}}}))
    (repo / "AGENTS.md").write_text("# Our rules\n\nBe kind.\n")
    for _ in range(2):   # twice: our entries replaced, never doubled; the others kept
        written = install(repo, ["claude", "codex", "gemini"], allow_write=True)
    assert [p.relative_to(repo).as_posix() for p in written] == [
        ".mcp.json", ".claude/skills/autoloop/SKILL.md", ".codex/config.toml", "AGENTS.md", ".gemini/settings.json"]

    claude = json.loads((repo / ".mcp.json").read_text())
    jsonschema.validate(claude, CLAUDE)
    assert claude["mcpServers"]["other"] == {"command": "other-server"}
    assert claude["mcpServers"]["autoloop"]["args"] == ["mcp", "--allow-write"]
    meta, body = front_matter((repo / ".claude/skills/autoloop/SKILL.md").read_text())
    jsonschema.validate(meta, SKILL)
    assert meta["name"] == "autoloop"
    for command in ("autoloop run", "autoloop status", "autoloop attempts", "autoloop note", "queue_patch",
                    "autoloop report", "autoloop verify"):
        assert command in body, command

    codex = tomllib.loads((repo / ".codex/config.toml").read_text())
    jsonschema.validate(codex, CODEX)
    assert codex["mcp_servers"]["autoloop"] == {"command": "autoloop", "args": ["mcp", "--allow-write"]}
    agents = (repo / "AGENTS.md").read_text()
    assert agents.startswith("# Our rules\n\nBe kind.\n") and agents.count(BEGIN) == agents.count(END) == 1

    gemini = json.loads((repo / ".gemini/settings.json").read_text())
    jsonschema.validate(gemini, GEMINI)
    assert gemini["mcpServers"]["autoloop"]["command"] == "autoloop"


def test_install_refuses_a_file_it_cannot_read(tmp_path):
    repo = init_repo(tmp_path / "repo")
    (repo / ".gemini").mkdir()
    (repo / ".gemini/settings.json").write_text("{ not json")
    with pytest.raises(InstallError, match=r"settings.json is not JSON"):
        install(repo, ["gemini"])
    assert (repo / ".gemini/settings.json").read_text() == "{ not json"


def test_init_commits_the_client_files(tmp_path):
    proc = autoloop_in_process(tmp_path, "init", "exp", "--install", "claude", "--install", "codex",
                               data_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    repo = tmp_path / "exp"
    assert git(repo, "status", "--porcelain") == ""
    assert {".mcp.json", ".claude/skills/autoloop/SKILL.md", ".codex/config.toml", "AGENTS.md"} <= \
        set(git(repo, "ls-files").split())
    cli = autoloop_in_process(repo, "mcp", "--install", "gemini", data_dir=tmp_path)
    assert cli.returncode == 0 and "wrote .gemini/settings.json" in cli.stdout


def test_mcp_without_the_sdk_says_how_to_install_it(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "mcp" or m.startswith("mcp.")] + ["mcp"]:
        monkeypatch.setitem(sys.modules, name, None)   # as though it were not installed
    proc = autoloop_in_process(tmp_path, "mcp", data_dir=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "autoloop: autoloop mcp needs the MCP SDK: pip install 'autoloop[mcp]'"


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    return build_night(tmp_path_factory.mktemp("night"), realistic_steps(), tag="t")


def test_attempts_json_matches_its_schema_and_the_tsv(night):
    proc = autoloop_in_process(night.repo, "attempts", "--json", data_dir=night.repo)
    payload = json.loads(proc.stdout)
    jsonschema.validate(payload, schema("attempts"))
    assert [r["label"] for r in payload["rows"]] == [t["trial"] for t in read_tsv(night.repo)]
    skips = json.loads(autoloop_in_process(night.repo, "attempts", "--json", "--status", "skip,crash",
                                           data_dir=night.repo).stdout)
    assert {r["status"] for r in skips["rows"]} == {"skip", "crash"}
    table = autoloop_in_process(night.repo, "attempts", "--kept", "--limit", "2", data_dir=night.repo).stdout
    assert table.splitlines()[0].split()[:3] == ["trial", "status", "crash"] and "(the last 2 of 7)" in table
    bad = autoloop_in_process(night.repo, "attempts", "--status", "won", data_dir=night.repo)
    assert bad.returncode == 1 and bad.stderr.strip() == \
        "autoloop: no status won: choose from keep, discard, crash, ended, skip, pruned"


def test_status_and_verify_json_match_their_schemas(night):
    status = json.loads(autoloop_in_process(night.repo, "status", "--json", data_dir=night.repo).stdout)
    jsonschema.validate(status, schema("status"))
    assert status["version"] == 1 and status["tag"] == "t"
    jsonschema.validate(verify_payload(None), schema("verify"))
    plan = Plan(tag="t", best="b" * 40, best_metric=1.0, baseline="a" * 40, direction="min", repeats=3,
                seeds=[1, 2, 3])
    summary = Summary(plan, {}, {"best": 0}, Estimate(0.01, 0.002, 3, "confirmed"),
                      [ChangeVerdict((2, 3), "wider; deeper", "grouped", Estimate(0.001, 0.004, 3, "within noise"))])
    payload = verify_payload(summary)
    jsonschema.validate(payload, schema("verify"))
    assert payload["changes"][0]["contribution"]["low"] == pytest.approx(-0.003)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**payload, "version": 2}, schema("verify"))


def test_a_stop_request_ends_the_night_before_its_next_trial(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    queue_file(repo, "01_good.py", GOOD, "restore the learning rates")
    results = repo / "results"
    before = read_ledger(repo)
    # For this orchestrator (autoloop_in_process runs it in this process): no trial starts.
    request_stop(results, os.getpid())
    proc = autoloop_in_process(repo, *run_args(), "--resume", data_dir=tiny_data_dir)
    assert proc.returncode == 0 and "stop requested at" in proc.stdout, proc.stdout + proc.stderr
    assert read_ledger(repo) == before and (results / "queue" / "01_good.py").exists()
    assert not (results / "stop-request.json").exists()
    # A request left for an orchestrator long gone stops nothing, and is removed.
    request_stop(results, 2 ** 22 + 4321)
    proc = autoloop_in_process(repo, *run_args(), "--resume", data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["status"] for r in read_ledger(repo)[len(before):]] == ["keep"]
    assert not (results / "stop-request.json").exists()
