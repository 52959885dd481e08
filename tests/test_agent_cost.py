"""Agent usage and cost where the CLI reports it (autoloop/proposers/usage.py): recorded per
call, totalled in status and the report, --max-agent-cost stops the night cleanly. The
end-to-end test runs a real fake agent that prints a Claude-Code-style JSON result."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.loop import BUDGET, LR_ARGS, assert_invariants, autoloop

from autoloop.proposers.usage import read_usage
from autoloop.store.ledger import LedgerRecord
from autoloop.store.queries import agent_spend

FAKE = Path(__file__).resolve().parent / "fake_agents"


def test_claude_json_and_stream_results():
    single = json.dumps({"type": "result", "total_cost_usd": 0.25, "result": "done",
                         "usage": {"input_tokens": 10, "cache_read_input_tokens": 300, "cache_creation_input_tokens": 7,
                                   "output_tokens": 20}})
    usage = read_usage("some text\n" + single + "\n")
    assert (usage.cost_usd, usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (0.25, 10, 20, 307)
    stream = "\n".join([json.dumps({"type": "system", "subtype": "init"}),
                        json.dumps({"type": "assistant", "message": {"usage": {"input_tokens": 5}}}),
                        json.dumps({"type": "result", "total_cost_usd": 0.5, "usage": {"output_tokens": 3}})])
    assert read_usage(stream).cost_usd == 0.5


def test_codex_turns_are_summed_and_carry_no_cost():
    events = [{"type": "thread.started"}, {"type": "turn.completed", "usage": {"input_tokens": 100,
                                                                                "cached_input_tokens": 40,
                                                                                "output_tokens": 7}},
              {"type": "turn.completed", "usage": {"input_tokens": 50, "cached_input_tokens": 0, "output_tokens": 3}}]
    usage = read_usage("\n".join(map(json.dumps, events)))
    assert usage.as_extra() == {"input_tokens": 150, "output_tokens": 10, "cached_tokens": 40,
                                "reported_by": "codex turn.completed"}


def test_aider_usage_lines():
    log = ("Tokens: 2.3k sent, 1.1k cache write, 120 received. Cost: $0.01 message, $0.01 session.\n"
           "Applied edit to train.py\n"
           "Tokens: 12k sent, 98 received. Cost: $0.04 message, $0.05 session.\n")
    usage = read_usage(log)
    assert (usage.cost_usd, usage.input_tokens, usage.output_tokens) == (0.05, 14300, 218)


def test_nothing_reported_is_none_never_an_estimate():
    assert read_usage("I changed the learning rate.\n{not json}\n") is None
    assert read_usage(json.dumps({"type": "result", "result": "no usage fields"})) is None


def test_spend_totals_over_the_records():
    def rec(trial, usage):
        return LedgerRecord(trial=trial, started_at=0, ended_at=1, proposer="agent", description="x", status="skip",
                            extra={"agent_usage": usage})
    records = [rec(1, {"cost_usd": 0.1, "input_tokens": 10, "output_tokens": 1}), rec(2, None),
               rec(3, {"input_tokens": 5, "output_tokens": 2}),
               LedgerRecord(trial=4, started_at=0, ended_at=1, proposer="mutate", description="y", status="skip")]
    spend = agent_spend(records)
    assert (spend.calls, round(spend.cost_usd, 6), spend.input_tokens, spend.output_tokens, spend.unreported,
            spend.without_cost) == (3, 0.1, 15, 3, 1, 1)


def test_the_cost_is_recorded_and_max_agent_cost_stops_the_night(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    proc = autoloop(repo, "run", "--budget", BUDGET, "--timeout", "60", "--tag", "t", "--device", "cpu", "--resume",
                    "--agent-cmd", f"{FAKE / 'claude_json.py'} 0.30 {LR_ARGS}", "--max-agent-cost", "0.5",
                    "--max-trials", "5", data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    calls = [r for r in ledger if "agent_usage" in r["extra"]]
    assert [r["trial"] for r in calls] == [1, 2]        # $0.30, then $0.60 >= $0.50: no third call
    assert calls[0]["extra"]["agent_usage"] == {"cost_usd": 0.3, "input_tokens": calls[0]["extra"]["agent_usage"][
        "input_tokens"], "output_tokens": 200, "cached_tokens": 6000, "reported_by": "claude json result"}
    reason = "the agent calls cost $0.60 as reported, reaching --max-agent-cost $0.50 (2 calls)"
    assert json.loads((repo / "results" / "state.json").read_text())["stop_reason"] == reason
    assert f"stopped: {reason}." in proc.stdout
    assert "reported no" not in proc.stdout                 # every call reported its cost
    status = autoloop(repo, "status", data_dir=tiny_data_dir, check=True).stdout
    assert "agent cost: $0.60 over 2 agent calls (" in status
    autoloop(repo, "report", data_dir=tiny_data_dir, check=True)
    report = (repo / "results" / "report.md").read_text()
    assert "## Agent cost" in report and "$0.60 over 2 agent calls" in report
