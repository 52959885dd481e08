"""Settings of the optuna and portfolio proposers: flags, config keys, one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers.git import TRAIN_PY, init_repo

from autoloop.config.loading import ConfigError, load_settings
from autoloop.proposers.base import ProposerError
from autoloop.proposers.choose import make_proposer


def test_defaults(tmp_path):
    s = load_settings(tmp_path, {})
    assert (s.sampler, s.portfolio) == ("tpe", None)


def test_flags_and_file(tmp_path):
    s = load_settings(tmp_path, {"proposer": "optuna", "sampler": "cmaes"})
    assert (s.proposer, s.sampler) == ("optuna", "cmaes")
    s = load_settings(tmp_path, {"portfolio": "agent, optuna,mutate"})
    assert s.portfolio == ["agent", "optuna", "mutate"]
    (tmp_path / "autoloop.toml").write_text('proposer = "portfolio"\nportfolio = ["optuna", "queue"]\nsampler = "gp"\n')
    s = load_settings(tmp_path, {})
    assert (s.proposer, s.portfolio, s.sampler) == ("portfolio", ["optuna", "queue"], "gp")


@pytest.mark.parametrize("overrides, message", [
    ({"sampler": "random"}, "--sampler: must be 'tpe', 'cmaes' or 'gp', got 'random'"),
    ({"portfolio": "optuna,human"},
     "--portfolio: unknown proposer 'human' (a portfolio takes agent, optuna, mutate, queue, combine)"),
    ({"portfolio": "optuna,optuna"}, "--portfolio: a proposer is listed twice: optuna,optuna"),
    ({"portfolio": "optuna"}, "--portfolio: a portfolio needs at least two proposers, got optuna"),
    ({"portfolio": ","}, "--portfolio: a portfolio needs at least two proposers, got none"),
    ({"portfolio": "optuna,mutate", "proposer": "mutate"},
     "--portfolio: only used with proposer 'portfolio' (the proposer is 'mutate')"),
])
def test_bad_values_are_one_line(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as e:
        load_settings(tmp_path, overrides)
    assert str(e.value) == message


def test_portfolio_members_and_the_default(tmp_path):
    repo = init_repo(tmp_path / "repo", {"train.py": TRAIN_PY.read_text()})
    proposer, why = make_proposer(load_settings(repo, {"proposer": "portfolio"}), repo)
    assert list(proposer.members) == ["optuna", "mutate"] and not proposer.can_fix
    assert why.startswith("proposer: portfolio of optuna, mutate, a Thompson-sampling bandit")
    proposer, why = make_proposer(load_settings(repo, {"portfolio": "agent,mutate", "agent_cmd": "true"}), repo)
    assert list(proposer.members) == ["agent", "mutate"] and proposer.can_fix
    assert "(auto: --portfolio given)" in why
    with pytest.raises(ProposerError, match="^--portfolio includes agent: pass --agent PRESET"):
        make_proposer(load_settings(repo, {"portfolio": "agent,mutate"}), repo)


def test_help_teaches_the_new_flags():
    out = subprocess.run([sys.executable, "-m", "autoloop.cli", "run", "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert "--sampler {tpe,cmaes,gp}" in out and "--portfolio LIST" in out
    assert "optuna" in out and "portfolio" in out
