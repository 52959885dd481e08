"""The portfolio: trial outcomes read from the ledger, the Thompson-sampling bandit, and a
night through the real CLI with a fake agent (a real executable), Optuna and the mutator on
a scripted train.py stand-in, stopped and resumed."""

from __future__ import annotations

import random
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers.git import init_repo
from helpers.loop import assert_invariants, autoloop

from autoloop.proposers.base import Proposal, ProposalFailed, ProposalRequest
from autoloop.proposers.outcomes import portfolio_skip_reason, proposer_yields, trial_outcomes
from autoloop.proposers.portfolio import Arm, PortfolioProposer, evidence, thompson
from autoloop.store.ledger import LedgerRecord

BOWL = Path(__file__).resolve().parent / "trial_scripts" / "bowl.py"
FAKE = Path(__file__).resolve().parent / "fake_agents"
FAST = ["--budget", "1", "--timeout", "30", "--command", f"{sys.executable} train.py", "--tag", "t", "--device", "cpu"]


def rec(trial: int, attempt: int = 1, **kw) -> LedgerRecord:
    t = 1000.0 + 100 * trial + 10 * attempt
    fields = dict(trial=trial, attempt=attempt, started_at=t, ended_at=t + 60, proposer="portfolio",
                  description="x", status="discard", commit=f"{trial}{attempt}" * 5)
    fields.update(kw)
    return LedgerRecord(**fields)


def chosen(member: str, propose_s: float = 0.0) -> dict:
    return {"portfolio": {"choice": member, "reason": "test", "propose_s": propose_s}}


# ------------------------------------------------------------------------------ outcomes


def test_the_value_of_a_trial_is_the_mean_of_its_judged_runs():
    records = [
        rec(0, kind="baseline", proposer="-", status="keep", metric=1.0, best="0" * 10, best_metric=1.0),
        # trial 1: a within-noise gain, re-run once and kept on the mean
        rec(1, metric=0.98, extra={"confirm": "pending", **chosen("optuna", 2.0)}, best="0" * 10, best_metric=1.0),
        rec(1, 2, kind="confirm", metric=0.96, commit="11" * 5, status="keep", best="11" * 5, best_metric=0.97),
        # trial 2: crashed
        rec(2, status="crash", crash="fundamental", reason="loss is nan", extra=chosen("mutate")),
        # trial 3: killed during its run
        rec(3, status="crash", crash="fundamental", reason="interrupted (orchestrator stopped during running)"),
        # trial 4: the agent failed to propose
        rec(4, status="skip", commit=None, started_at=1500.0, ended_at=1500.0,
            reason=portfolio_skip_reason("agent", "thompson draw (keeps/h): agent 1 > optuna 0.5", 42.5,
                                         "agent exited with code 1 (see results/agents/4-1.log)")),
        # trial 5: a parallel worker's replay on a new best is another commit: not in the value
        rec(5, metric=0.95, extra=chosen("optuna"), best="11" * 5, best_metric=0.97),
        rec(5, 2, kind="confirm", metric=0.5, commit="ffff", extra={"replay_of": "51" * 5}),
    ]
    out = trial_outcomes(records)
    assert out[0].value == 1.0 and out[0].kind == "baseline"
    assert out[1].value == pytest.approx(0.97) and out[1].runs == 2 and out[1].kept
    assert out[1].gain == pytest.approx(0.03) and out[1].proposer == "optuna"
    assert out[1].seconds == pytest.approx(60 + 60 + 2.0)     # both attempts and the proposing time
    assert out[2].status == "crash" and out[2].value is None and out[2].proposer == "mutate"
    assert out[3].status == "interrupted" and out[3].proposer == "portfolio"
    assert out[4].status == "skip" and out[4].proposer == "agent" and out[4].seconds == pytest.approx(42.5)
    assert out[5].value == 0.95 and out[5].runs == 1 and not out[5].kept
    yields = proposer_yields(records)
    assert list(yields) == ["optuna", "mutate", "portfolio", "agent"]
    assert (yields["optuna"].trials, yields["optuna"].keeps) == (2, 1)
    assert yields["optuna"].gain == pytest.approx(0.03)
    assert (yields["agent"].trials, yields["agent"].failed) == (1, 1)


def test_gain_follows_the_direction():
    records = [rec(0, kind="baseline", status="keep", metric=1.0, best="0" * 10, best_metric=1.0),
               rec(1, status="keep", metric=1.5, best="11" * 5, best_metric=1.5, extra=chosen("mutate"))]
    assert trial_outcomes(records, "max")[1].gain == pytest.approx(0.5)


# ------------------------------------------------------------------------------ the bandit


def test_the_bandit_spends_trials_where_they_pay_and_still_explores():
    arms = {"optuna": Arm("optuna", trials=10, keeps=4, weighted_keeps=4, weighted_gain=0.04, weighted_seconds=3000),
            "mutate": Arm("mutate", trials=10, keeps=0, weighted_seconds=3000)}
    rng = random.Random(1)
    picks = Counter(max(d, key=d.get) for d in (thompson(arms, rng, 300) for _ in range(2000)))
    assert picks["optuna"] > 0.9 * 2000
    assert picks["mutate"] > 0      # never ruled out


def test_untried_members_are_drawn_alike():
    arms = {n: Arm(n) for n in ("agent", "optuna", "mutate")}
    rng = random.Random(2)
    picks = Counter(max(d, key=d.get) for d in (thompson(arms, rng, 300) for _ in range(3000)))
    assert all(800 < picks[n] < 1200 for n in arms), picks


def test_time_is_charged_at_least_one_budget_per_trial():
    records = [rec(0, kind="baseline", status="keep", metric=1.0, best="0" * 10, best_metric=1.0),
               rec(1, status="skip", started_at=1100, ended_at=1100,
                   reason=portfolio_skip_reason("agent", "why", 1.5, "agent made no change to train.py"))]
    arms = evidence(trial_outcomes(records), ["agent", "mutate"], min_trial_s=300)
    assert (arms["agent"].trials, arms["agent"].weighted_seconds) == (1, 300)
    assert (arms["mutate"].trials, arms["mutate"].weighted_seconds) == (0, 0)


def test_old_evidence_counts_less():
    records = [rec(0, kind="baseline", status="keep", metric=1.0, best="0" * 10, best_metric=1.0)]
    best = 1.0
    for trial in range(1, 31):   # optuna kept its first 10 trials, then mutate its last 10
        member = "optuna" if trial <= 20 else "mutate"
        kept = trial <= 10 or trial > 20
        best -= 0.01 if kept else 0
        records.append(rec(trial, status="keep" if kept else "discard", metric=best, best="b" * 10,
                           best_metric=best, extra=chosen(member)))
    arms = evidence(trial_outcomes(records), ["optuna", "mutate"], 300)
    assert (arms["optuna"].keeps, arms["mutate"].keeps) == (10, 10)          # as counted
    # as weighed: 20 trials older is 2 half-lives, a quarter of the weight
    assert arms["mutate"].weighted_keeps == pytest.approx(4 * arms["optuna"].weighted_keeps)
    rng = random.Random(3)
    picks = Counter(max(d, key=d.get) for d in (thompson(arms, rng, 300) for _ in range(1000)))
    assert picks["mutate"] > picks["optuna"]


class Scripted:
    """A member that answers from a list: a description, None (no more ideas), or an error."""

    def __init__(self, name, answers, can_fix=False):
        self.name, self.answers, self.can_fix, self.calls = name, list(answers), can_fix, 0

    def propose(self, request):
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return None if answer is None else Proposal(description=answer, extra={"own": 1})


def request(tmp_path, trial=1, fix=None) -> ProposalRequest:
    return ProposalRequest(workspace=tmp_path, target="train.py", program_text="", metric_name="val_bpb",
                           direction="min", parent_metric=1.0, parent="b" * 40, trial=trial, attempt=1, seed=42,
                           fix=fix, results_dir=tmp_path / "results")


def test_a_member_out_of_ideas_passes_to_the_next_draw(tmp_path):
    members = {"mutate": Scripted("mutate", [None]), "optuna": Scripted("optuna", [None])}
    assert PortfolioProposer(members, 300).propose(request(tmp_path)) is None   # none has an idea: the night stops
    assert members["mutate"].calls == members["optuna"].calls == 1
    members = {"mutate": Scripted("mutate", [None] * 20), "optuna": Scripted("optuna", ["LR 1 -> 2"] * 20)}
    portfolio = PortfolioProposer(members, 300)
    passed = []
    for trial in range(1, 21):
        calls = members["mutate"].calls
        proposal = portfolio.propose(request(tmp_path, trial=trial))
        assert proposal.extra["own"] == 1 and proposal.extra["portfolio"]["choice"] == "optuna"
        asked_mutate = members["mutate"].calls > calls
        assert ("no more ideas from mutate" in proposal.extra["portfolio"]["reason"]) == asked_mutate
        passed.append(asked_mutate)
    assert any(passed) and not all(passed)   # drawn first sometimes, second other times


def test_a_failed_member_names_itself_in_the_skip(tmp_path):
    members = {"agent": Scripted("agent", [ProposalFailed("agent timed out after 15m")]),
               "mutate": Scripted("mutate", [])}
    portfolio = PortfolioProposer(members, 300)
    portfolio_request = request(tmp_path, trial=3)
    # Which member is drawn first is the bandit's; find a trial number where it is the agent.
    for trial in range(1, 50):
        portfolio_request.trial = trial
        draws = thompson(evidence({}, list(members), 300),
                         random.Random(f"autoloop-portfolio:42:{trial}"), 300)
        if max(draws, key=draws.get) == "agent":
            break
    with pytest.raises(ProposalFailed) as e:
        portfolio.propose(portfolio_request)
    assert re.match(r"^portfolio chose agent \(thompson draw .*\); "
                    r"it failed after \d+\.\d s: agent timed out after 15m$", str(e.value))
    choice = e.value.extra["portfolio"]
    assert choice["choice"] == "agent" and choice["reason"].startswith("thompson draw")
    assert f"it failed after {choice['propose_s']:.1f} s: " in str(e.value)   # the reason says the same
    # Read from the skip's extra (the reason is the person's) ...
    record = rec(trial, status="skip", reason="agent timed out", extra={"portfolio": {**choice, "propose_s": 7.5}})
    assert (trial_outcomes([record])[trial].proposer, trial_outcomes([record])[trial].seconds) == ("agent", 67.5)
    # ... and from the reason alone in a ledger written before the skip carried it.
    old = rec(trial, status="skip", reason=str(e.value))
    assert trial_outcomes([old])[trial].proposer == "agent"


# ------------------------------------------------------------------------------ a night


def keeps_and_trials(reason: str) -> dict[str, tuple[int, int]]:
    """'... keeps/trials so far: agent 0/1, optuna 1/2' -> {'agent': (0, 1), 'optuna': (1, 2)}"""
    seen = reason.split("keeps/trials so far: ")[1].split(";")[0]
    return {name: tuple(map(int, kt.split("/"))) for name, kt in (part.split() for part in seen.split(", "))}


def test_portfolio_choices_are_recorded_and_survive_a_restart(tmp_path, tiny_data_dir):
    repo = init_repo(tmp_path / "repo", {"train.py": BOWL.read_text(), "program.md": "goal: lowest val_bpb\n"})
    agent = f"{sys.executable} {FAKE / 'improve.py'} LR=0.1"
    # Serial (--lookahead 0): with an agent member the portfolio looks ahead by default, and
    # a choice made while trial n trains cannot count n; here every earlier trial must count.
    args = ["run", "--portfolio", "agent,optuna,mutate", "--agent-cmd", agent, "--lookahead", "0", *FAST]
    first = autoloop(repo, *args, "--max-trials", "4", data_dir=tiny_data_dir)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "proposer: portfolio of agent, optuna, mutate" in first.stdout
    second = autoloop(repo, *args, "--max-trials", "5", "--resume", data_dir=tiny_data_dir)
    assert second.returncode == 0, second.stdout + second.stderr
    ledger = assert_invariants(repo)
    firsts = [r for r in ledger if r["attempt"] == 1 and r["kind"] != "baseline"]
    assert len(firsts) >= 9
    members = Counter()
    for r in firsts:
        if r["status"] == "skip":
            m = re.match(r"^portfolio chose (\w+) \((thompson draw [^;]*; keeps/trials so far: [^)]*)\)", r["reason"])
            assert m, r["reason"]
            member, reason = m[1], m[2]
        else:
            member, reason = r["extra"]["portfolio"]["choice"], r["extra"]["portfolio"]["reason"]
            assert r["proposer"] == "portfolio" and r["extra"]["portfolio"]["propose_s"] >= 0
        assert member in ("agent", "optuna", "mutate"), r
        # The evidence each choice was made on is every earlier trial of the night, the
        # ones before the restart included: the bandit's state is the ledger.
        counts = keeps_and_trials(reason)
        assert sum(t for _, t in counts.values()) == r["trial"] - 1, (r["trial"], reason)
        members[member] += 1
        if member == "optuna" and r["status"] != "skip":
            assert "optuna" in r["extra"] and " -> " in r["description"]
    assert len(members) >= 2, members
    # The morning report: what each member brought.
    report = autoloop(repo, "report", data_dir=tiny_data_dir)
    assert report.returncode == 0, report.stderr
    text = (repo / "results" / "report.md").read_text()
    section = text.split("## Proposers")[1].split("\n## ")[0]
    for member, n in members.items():
        assert re.search(rf"^\| {member} \| {n} \|", section, re.M), section


def test_a_fix_request_goes_back_to_the_member_that_made_the_edit(tmp_path, tiny_data_dir):
    repo = init_repo(tmp_path / "repo", {"train.py": BOWL.read_text(), "program.md": "goal: lowest val_bpb\n"})
    # The agent breaks train.py, then fixes it when asked (tests/fake_agents/syntax_then_fix.py).
    agent = f"{sys.executable} {FAKE / 'syntax_then_fix.py'} {{prompt_file}} LR=0.1"
    proc = autoloop(repo, "run", "--portfolio", "agent,mutate", "--agent-cmd", agent, *FAST, "--max-trials", "8",
                    data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    fixes = [r for r in ledger if r["kind"] == "fix"]
    agent_trials = {r["trial"] for r in ledger if (r["extra"].get("portfolio") or {}).get("choice") == "agent"
                    and r["attempt"] == 1}
    if not agent_trials:
        pytest.fail(f"the bandit never chose the agent in 8 trials: {[r['extra'] for r in ledger]}")
    assert fixes and {r["trial"] for r in fixes} <= agent_trials
    for r in fixes:
        assert r["extra"]["portfolio"]["choice"] == "agent"
        assert r["extra"]["portfolio"]["reason"] == f"fix request for its own trial {r['trial']}"


def test_a_member_whose_edit_cannot_run_is_charged_for_its_skip(tmp_path, tiny_data_dir):
    # The queue's replacement is train.py as it is: the screen skips the trial, and the skip
    # still says whose proposal it was (the engine carries Proposal.extra into it).
    repo = init_repo(tmp_path / "repo", {"train.py": BOWL.read_text()})
    queue = repo / "results" / "queue"
    queue.mkdir(parents=True)
    (queue / "01_same.py").write_text(BOWL.read_text())
    proc = autoloop(repo, "run", "--portfolio", "queue,mutate", *FAST, "--max-trials", "6", data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    skips = [r for r in ledger if r["status"] == "skip"]
    if not skips:
        pytest.fail(f"the bandit never chose the queue in 6 trials: {[r['extra'] for r in ledger]}")
    (skip,) = skips
    assert skip["reason"] == "proposal made no change to train.py"
    assert skip["extra"]["portfolio"]["choice"] == "queue" and skip["extra"]["portfolio"]["propose_s"] >= 0
    yields = proposer_yields([LedgerRecord.model_validate(r) for r in ledger])
    assert "portfolio" not in yields and yields["queue"].failed == 1 and yields["queue"].trials == 1


def test_the_report_shows_what_each_proposer_brought():
    from autoloop.review.report import report_markdown

    records = [rec(0, kind="baseline", proposer="-", status="keep", metric=1.0, best="0" * 10, best_metric=1.0),
               rec(1, status="keep", metric=0.9, best="11" * 5, best_metric=0.9, extra=chosen("optuna")),
               rec(2, metric=0.95, best="11" * 5, best_metric=0.9, extra=chosen("mutate")),
               rec(3, status="skip", commit=None, started_at=1400.0, ended_at=1400.0, best="11" * 5, best_metric=0.9,
                   reason=portfolio_skip_reason("agent", "why", 30.0, "agent exited with code 1"))]
    md = report_markdown(records, {}, tag="t", picture=None, now=2000.0)
    section = md.split("## Proposers\n\n")[1].split("\n## ")[0]
    assert section.startswith("optuna: 1 keep in 1 trial, -0.1000; mutate: 0 keeps in 1 trial, 0; "
                              "agent: 0 keeps in 1 trial, 0.\n")
    assert "| optuna | 1 | 1 | 0 | -0.1000 | 1m | -6.0000 |" in section   # -0.1 in one minute: -6 per hour
    assert "| agent | 1 | 0 | 1 | 0 | 30s | 0 |" in section             # its failure's time, from the skip
