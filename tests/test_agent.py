"""The agent proposer, driven by fake agents that are real executables (tests/fake_agents/).

The first tests call AgentProposer and make_proposer directly (no training); the rest run
the real CLI in a copy of the baselined repo with real 2-second training, like
test_loop.py.
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
from pathlib import Path

import psutil
import pytest
from helpers.git import git, init_repo
from helpers.loop import BUDGET, GOOD, LR_ARGS, LRS, SLOW, assert_invariants, autoloop, queue_file, set_constants

from autoloop.cli.main import build_parser, settings_from
from autoloop.config.settings import Settings
from autoloop.proposers.agent import PRESETS, AgentProposer, describe_change, split_command
from autoloop.proposers.base import FixContext, ProposalFailed, ProposalRequest, ProposerError
from autoloop.proposers.choose import make_proposer
from autoloop.store.ledger import LedgerRecord

FAKE = Path(__file__).resolve().parent / "fake_agents"
PROGRAM = "# program.md\nGoal: the lowest val_bpb. Edit train.py only.\n"
# No trial here is meant to hang: a roomy hard limit keeps a loaded machine from failing them.
TIMEOUT = "60"
# The fake agents restore train.py's own learning rates (helpers.loop.LR_ARGS), which SLOW
# has made tiny, so the tests follow whatever train.py is tuned to.
RESTORED = set_constants(SLOW, **LRS)


# ------------------------------------------------------------------------------ the proposer alone


def request(workspace: Path, fix: FixContext | None = None, attempt: int = 1) -> ProposalRequest:
    tail = [dict(row, started_at=0.0, ended_at=1.0, proposer="agent", commit=f"{row['trial']:040x}") for row in [
        {"trial": 0, "attempt": 1, "status": "keep", "metric": 2.5, "crash": None, "description": "baseline"},
        {"trial": 1, "attempt": 1, "status": "discard", "metric": 2.6, "crash": None,
         "description": "MATRIX_LR 0.04 -> 0.08"},
        {"trial": 2, "attempt": 1, "status": "crash", "metric": None, "crash": "fundamental",
         "description": "nan | everywhere"},
        {"trial": 3, "attempt": 1, "status": "skip", "metric": None, "crash": None, "description": "-",
         "reason": "agent made no change to train.py"},
    ]]
    tail[0].update(kind="baseline", best=tail[0]["commit"], best_metric=2.5)
    tail[3]["commit"] = None
    return ProposalRequest(
        workspace=workspace, target="train.py", program_text=PROGRAM, metric_name="val_bpb", direction="min",
        parent_metric=2.5, parent="abcdef1234567890", trial=4, attempt=attempt, seed=42, ledger_tail=tail,
        fix=fix, results_dir=workspace / "results", history=[LedgerRecord.model_validate(r) for r in tail],
    )


@pytest.fixture
def workspace(tmp_path) -> Path:
    (tmp_path / "train.py").write_text("LR = 0.1\nSTEPS = 10\nprint('train')\n")
    return tmp_path


def test_prompt_on_stdin_and_in_the_prompt_file(workspace, tmp_path):
    out = tmp_path / "seen"
    agent = AgentProposer(f"{FAKE / 'record_prompt.py'} {{prompt_file}} {out}", timeout_s=30)
    proposal = agent.propose(request(workspace))

    prompt_file = workspace / "results" / "agents" / "4-1.prompt.md"
    prompt = prompt_file.read_text()
    assert (out / "stdin.txt").read_text() == prompt
    assert (out / "prompt_file.txt").read_text() == str(prompt_file)
    env = json.loads((out / "env.json").read_text())
    assert env["AUTOLOOP_PROMPT_FILE"] == str(prompt_file)
    assert env["AUTOLOOP_DESCRIPTION_FILE"] == str(workspace / "results" / "agents" / "4-1.description.txt")
    assert env["AUTOLOOP_TARGET"] == "train.py" and env["AUTOLOOP_TRIAL"] == "4"
    assert env["AUTOLOOP_HYPOTHESIS_FILE"] == str(workspace / "results" / "agents" / "4-1.hypothesis.txt")
    assert env["AUTOLOOP_HYPOTHESIS_FILE"] in prompt
    assert Path((out / "cwd.txt").read_text()) == workspace
    # program.md, the best so far, the research digest of the night (tests/test_digest.py), the task.
    assert prompt.startswith(PROGRAM.strip())
    assert "Best so far: val_bpb 2.500000 at commit abcdef1" in prompt
    assert "- MATRIX_LR: 1 try 0.08, best +0.100000" in prompt
    assert "- #2 crash fundamental - «nan everywhere»" in prompt
    assert "- #3 skip - «-»" in prompt and "«agent made no change to train.py»: 1" in prompt
    assert "## Your task" in prompt and "## Fix request" not in prompt
    # No description file: one is derived from the diff. The agent's output is logged.
    assert proposal.description == "edit train.py: +1 -0 lines"
    assert proposal.source == "agents/4-1.log"
    assert "recorded the prompt" in (workspace / "results" / "agents" / "4-1.log").read_text()


def test_the_hypothesis_file_goes_into_the_proposal(workspace):
    """One line from $AUTOLOOP_HYPOTHESIS_FILE (or {hypothesis_file}) becomes extra.hypothesis;
    a stale file from an earlier call never describes this one."""
    stale = workspace / "results" / "agents" / "4-1.hypothesis.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("left over\n")
    writes = AgentProposer("sh -c 'echo \"LR = 0.2\" >> train.py; printf \"\\n  wider steps   early\\nmore\" "
                           "> {hypothesis_file}'", timeout_s=30)
    assert writes.propose(request(workspace)).extra == {"hypothesis": "wider steps early", "agent_usage": None}
    silent = AgentProposer("sh -c 'echo \"LR = 0.3\" >> train.py'", timeout_s=30)
    assert silent.propose(request(workspace)).extra == {"agent_usage": None}   # sh reports no usage


def test_fix_request_prompt_carries_the_crash(workspace, tmp_path):
    fix = FixContext(crash="trivial", reason="NameError: name 'lr' is not defined",
                     log_tail="Traceback (most recent call last):\n  File \"train.py\"\nNameError: name 'lr'",
                     description="raise LR")
    out = tmp_path / "seen"
    agent = AgentProposer(f"{FAKE / 'record_prompt.py'} {{prompt_file}} {out}", timeout_s=30)
    proposal = agent.propose(request(workspace, fix=fix, attempt=2))
    prompt = (out / "stdin.txt").read_text()
    assert "## Fix request" in prompt
    assert "Your last change (\"raise LR\") crashed: trivial: NameError: name 'lr' is not defined" in prompt
    assert "Traceback (most recent call last):" in prompt and "## Your task" not in prompt
    assert proposal.description == "raise LR (fix: edit train.py: +1 -0 lines)"


@pytest.mark.parametrize("agent,reason", [
    ("no_change.py", "agent made no change to train.py"),
    ("fail.py", "agent exited with code 3: error: no API key configured"),
])
def test_failures_are_proposal_failed(workspace, agent, reason):
    with pytest.raises(ProposalFailed) as info:
        AgentProposer(str(FAKE / agent), timeout_s=30).propose(request(workspace))
    assert str(info.value).startswith(reason)


def test_description_from_the_diff():
    before = "LR = 0.1  # rate\nWD = 0.0\nprint(LR)\n"
    assert describe_change(before, before.replace("0.1", "0.2"), "train.py") == "LR 0.1 -> 0.2"
    assert describe_change(before, before.replace("0.1", "0.2").replace("0.0", "0.01"), "train.py") == \
        "LR 0.1 -> 0.2, WD 0.0 -> 0.01"
    assert describe_change(before, before + "print('x')\n", "train.py") == "edit train.py: +1 -0 lines"
    assert describe_change(before, before.replace("0.1", "0.2") + "x = 1\n", "train.py") == \
        "LR 0.1 -> 0.2; edit train.py: +2 -1 lines"
    assert describe_change(before, "def broken(:\n", "train.py") == "edit train.py: +1 -3 lines"


def test_presets_are_headless_commands():
    """The flags checked against each CLI's --help (presets.py; the stand-ins in
    tests/fake_clis/ and test_agent_presets.py run them)."""
    assert PRESETS["claude"].startswith("claude -p --dangerously-skip-permissions")
    assert PRESETS["codex"].startswith("codex exec") and "--add-dir {results_dir}" in PRESETS["codex"]
    assert "--message-file {prompt_file}" in PRESETS["aider"] and "--no-auto-commits" in PRESETS["aider"]
    assert "--map-tokens 0" in PRESETS["aider"]                  # no .aider.tags.cache.v4/ in the repository
    assert "--approval-mode yolo --skip-trust" in PRESETS["gemini"] and " -p " in PRESETS["gemini"]
    assert "--include-directories {results_dir}" in PRESETS["gemini"]
    for template in PRESETS.values():
        assert split_command(template)   # each splits into arguments


# ------------------------------------------------------------------------------ choosing the proposer


def settings(**values) -> Settings:
    return Settings(**values)


def test_auto_prefers_the_agent_then_the_queue_then_mutate(tmp_path):
    repo = init_repo(tmp_path / "repo", {"train.py": GOOD})
    proposer, why = make_proposer(settings(agent_cmd=f"{FAKE / 'improve.py'}"), repo)
    assert proposer.name == "agent" and "auto: an agent is configured" in why
    queue_file(repo, "01.py", GOOD, "x")
    proposer, why = make_proposer(settings(), repo)
    assert proposer.name == "queue" and "1 patch waiting" in why and "no agent configured" in why
    proposer, why = make_proposer(settings(agent_cmd=f"{FAKE / 'improve.py'}"), repo)
    assert proposer.name == "agent"      # an agent beats waiting patches
    (repo / "results" / "queue" / "01.py").unlink()
    proposer, why = make_proposer(settings(), repo)
    assert proposer.name == "mutate" and "no agent configured, no patches" in why
    assert make_proposer(settings(proposer="mutate"), repo)[0].name == "mutate"
    proposer, why = make_proposer(settings(agent="claude", agent_cmd=f"{FAKE / 'improve.py'}"), repo)
    assert "--agent-cmd given: preset ignored" in why


@pytest.mark.parametrize("values,message", [
    ({"agent": "claude"}, "agent command not found: claude (install it or use --agent-cmd)"),
    ({"agent_cmd": "no-such-agent --flag"}, "agent command not found: no-such-agent (check --agent-cmd)"),
    ({"agent": "cursor"}, "unknown agent 'cursor' (known: claude, codex, aider, gemini"),
    ({"proposer": "agent"}, "--proposer agent needs an agent"),
])
def test_agent_setup_errors_are_one_line(tmp_path, monkeypatch, values, message):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(ProposerError) as info:
        make_proposer(settings(**values), tmp_path)
    assert str(info.value).startswith(message)


def test_cli_flags_map_to_settings(tmp_path):
    args = build_parser().parse_args(["run", "-C", str(tmp_path), "--agent", "codex", "--agent-cmd", "x {prompt_file}",
                                      "--agent-timeout", "3s", "--max-fix-attempts", "0", "--max-agent-failures", "2"])
    s = settings_from(args)
    assert (s.agent, s.agent_cmd, s.agent_timeout, s.max_fix_attempts, s.max_agent_failures) == \
        ("codex", "x {prompt_file}", 3.0, 0, 2)


def test_missing_agent_is_one_line_at_startup(tmp_path):
    repo = init_repo(tmp_path / "repo", {"train.py": SLOW})
    # A PATH with git alone: no claude anywhere (the harness itself runs as sys.executable -m).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to(shutil.which("git"))
    proc = autoloop(repo, "run", "--agent", "claude", "--budget", BUDGET, data_dir=tmp_path / "unused",
                    env={"PATH": str(bin_dir)})
    assert proc.returncode == 1
    assert proc.stderr.strip() == "autoloop: agent command not found: claude (install it or use --agent-cmd)"
    assert not (repo / "results" / "ledger.jsonl").exists()


# ------------------------------------------------------------------------------ the loop with an agent


def agent_run(repo: Path, data_dir: Path, agent_cmd: str, *extra: str) -> tuple[object, list[dict]]:
    proc = autoloop(repo, "run", "--budget", BUDGET, "--timeout", TIMEOUT, "--tag", "t", "--device", "cpu",
                    "--resume", "--agent-cmd", agent_cmd, *extra, data_dir=data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, assert_invariants(repo)


@pytest.mark.slow
def test_agent_improves_a_constant(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    proc, ledger = agent_run(repo, tiny_data_dir, f"{FAKE / 'improve.py'} {LR_ARGS}", "--max-trials", "1")
    assert "proposer: agent, --agent-cmd" in proc.stdout
    trial = ledger[-1]
    assert (trial["proposer"], trial["kind"], trial["status"], trial["description"]) == \
        ("agent", "candidate", "keep", "restore learning rates")
    assert trial["metric"] < ledger[0]["metric"] - 0.5
    assert trial["extra"]["source"] == "agents/1-1.log"
    assert "read a prompt of" in (repo / "results" / "agents" / "1-1.log").read_text()
    assert (repo / "train.py").read_text() == RESTORED


@pytest.mark.slow
def test_trivial_crash_goes_back_to_the_agent_as_a_fix(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    _, ledger = agent_run(repo, tiny_data_dir, f"{FAKE / 'syntax_then_fix.py'} {{prompt_file}} {LR_ARGS}",
                          "--max-trials", "1")
    rows = [(r["trial"], r["attempt"], r["kind"], r["status"], r["crash"]) for r in ledger[1:]]
    assert rows == [(1, 1, "candidate", "crash", "trivial"), (1, 2, "fix", "keep", None)]
    assert "SyntaxError" in ledger[1]["reason"]
    assert ledger[2]["description"] == "restore learning rates (syntax error fixed)"
    assert ledger[1]["commit"] != ledger[2]["commit"]      # each attempt is its own commit
    fix_prompt = (repo / "results" / "agents" / "1-2.prompt.md").read_text()
    assert "## Fix request" in fix_prompt and "crashed: trivial: SyntaxError" in fix_prompt
    assert "def broken(:" in fix_prompt                    # the log tail
    assert (repo / "train.py").read_text() == RESTORED


@pytest.mark.slow
def test_edits_outside_the_target_are_reverted_and_recorded(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    _, ledger = agent_run(repo, tiny_data_dir, f"{FAKE / 'outside_edit.py'} {LR_ARGS}", "--max-trials", "1")
    trial = ledger[-1]
    assert trial["outside_changes"] == ["helper.py"]
    assert trial["status"] == "keep"                       # judged on train.py alone
    assert not (repo / "helper.py").exists()
    assert (repo / "results" / "quarantine" / "1-1" / "helper.py").exists()
    assert git(repo, "show", "--name-only", "--format=", trial["commit"]) == "train.py"


@pytest.mark.parametrize("agent,reason", [
    ("no_change.py", "agent made no change to train.py"),
    ("fail.py", "agent exited with code 3: error: no API key configured"),
])
def test_failing_agent_stops_the_loop_after_n_in_a_row(baselined_repo, tiny_data_dir, agent, reason):
    repo = baselined_repo
    proc, ledger = agent_run(repo, tiny_data_dir, str(FAKE / agent), "--max-agent-failures", "2")
    skips = ledger[1:]
    assert [(r["trial"], r["status"]) for r in skips] == [(1, "skip"), (2, "skip")]
    assert all(r["reason"].startswith(reason) for r in skips)
    state = json.loads((repo / "results" / "state.json").read_text())
    assert state["stop_reason"].startswith("agent failed 2 times in a row (--max-agent-failures 2); last: " + reason)
    assert "agent failed 2 times in a row" in proc.stdout


def test_hanging_agent_is_killed_at_the_timeout(baselined_repo, tiny_data_dir, tmp_path):
    repo = baselined_repo
    pids_file = tmp_path / "pids"
    started = time.monotonic()
    proc, ledger = agent_run(repo, tiny_data_dir, f"{FAKE / 'hang.py'} {shlex.quote(str(pids_file))}",
                             "--agent-timeout", "2s", "--max-agent-failures", "1")
    assert time.monotonic() - started < 30
    assert ledger[-1]["status"] == "skip"
    assert ledger[-1]["reason"].startswith("agent timed out after 2s (process tree killed")
    assert "agent failed 1 time in a row" in proc.stdout
    for pid in map(int, pids_file.read_text().split()):     # the agent and its detached grandchild
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert "thinking very hard" in (repo / "results" / "agents" / "1-1.log").read_text()


@pytest.mark.slow
def test_mutate_runs_a_trial_through_the_loop(baselined_repo, tiny_data_dir):
    """auto without an agent or patches: the mutator, its description in the ledger."""
    repo = baselined_repo
    proc = autoloop(repo, "run", "--budget", BUDGET, "--timeout", TIMEOUT, "--tag", "t", "--device", "cpu",
                    "--resume", "--max-trials", "1", data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "proposer: mutate" in proc.stdout
    ledger = assert_invariants(repo)
    trial = ledger[-1]
    assert trial["proposer"] == "mutate" and trial["status"] in ("keep", "discard", "crash")
    name, _, rest = trial["description"].partition(" ")
    assert name.isupper() and " -> " in rest
    assert git(repo, "diff", "--numstat", trial["parent"], trial["commit"]).split()[:2] == ["1", "1"]


def test_a_chatty_agent_log_is_capped_like_a_trial_log(workspace, tmp_path):
    """--log-cap-mb applies to the agent's log too: head, one line saying what was cut, tail."""
    chatty = tmp_path / "chatty.py"
    chatty.write_text(
        "import pathlib, sys\n"
        "sys.stdin.read()\n"
        "for i in range(40000):\n"
        "    print(f'thinking {i:06d} ' + 'x' * 40)\n"
        "t = pathlib.Path('train.py')\n"
        "t.write_text(t.read_text().replace('LR = 0.1', 'LR = 0.2'))\n"
        "print('done editing')\n")
    settings = Settings(agent_cmd=f"python {chatty}", log_cap_mb=0.125)
    agent, _ = make_proposer(settings, workspace)
    proposal = agent.propose(request(workspace))
    assert proposal.description == "LR 0.1 -> 0.2"
    log = (workspace / "results" / "agents" / "4-1.log").read_bytes()
    assert len(log) < 0.125 * 2**20 + 4096 < 40000 * 55          # capped, far below the 2.2 MB printed
    assert b"thinking 000000" in log and b"done editing" in log   # head and tail kept
    assert b"of output cut here]" in log
