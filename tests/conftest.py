"""Shared fixtures (real git repositories in temporary folders, a small prepared dataset) and the hook that
keeps real training on one xdist worker. Helpers the tests import live in the helpers package."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.git import TRAIN_PY, init_repo, private_copy
from helpers.loop import SLOW, autoloop, run_args

# Small slices keep evaluation to a fraction of a second in tests.
TEST_VAL_BYTES = 16 * 1024
TEST_AUDIT_BYTES = 4 * 1024


@pytest.fixture
def git_repo(tmp_path) -> Path:
    """A fresh repo holding a copy of the real train.py."""
    return init_repo(tmp_path / "repo", {"train.py": TRAIN_PY.read_text()})


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    """The stdlib corpus prepared once per test session with small validation and audit slices."""
    from autoloop.data import CorpusSpec, prepare

    target = tmp_path_factory.mktemp("data") / "stdlib-small"
    prepare(CorpusSpec(val_bytes=TEST_VAL_BYTES, audit_bytes=TEST_AUDIT_BYTES), target)
    return target


@pytest.fixture
def trial_env(tiny_data_dir, monkeypatch) -> dict[str, str]:
    """Environment for a real train.py run in tests: small data, CPU, short budget."""
    env = {"AUTOLOOP_DATA_DIR": str(tiny_data_dir), "AUTOLOOP_DEVICE": "cpu", "AUTOLOOP_BUDGET_S": "3"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture(scope="session")
def baselined_template(tmp_path_factory, tiny_data_dir) -> Path:
    """A repo on branch autoloop/t whose baseline (the SLOW train.py) is recorded: the
    tests that start from there copy it instead of training the baseline again."""
    repo = init_repo(tmp_path_factory.mktemp("template") / "repo", {"train.py": SLOW})
    proc = autoloop(repo, *run_args(), data_dir=tiny_data_dir)
    assert proc.returncode == 0 and "no more ideas" in proc.stdout, proc.stdout + proc.stderr
    return repo


@pytest.fixture
def baselined_repo(baselined_template, tmp_path) -> Path:
    """A private copy of baselined_template."""
    return private_copy(baselined_template, tmp_path)


# The suite runs on two pytest-xdist workers (README: `-n 2 --dist loadgroup`). Tests that train
# the real train.py measure what a few seconds of CPU buys, so two of them side by side on a
# 2-core machine would starve each other into timeouts: they share one xdist group, which
# loadgroup runs on one worker, one after another, while the other worker takes the rest
# (scripted stand-ins, git, subprocess plumbing). Without xdist the mark does nothing.
REAL_TRAINING_FIXTURES = {"trial_env", "baselined_repo", "baselined_template"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        trains = item.get_closest_marker("slow") or REAL_TRAINING_FIXTURES & set(item.fixturenames)
        if trains or item.path.name == "test_train.py":
            item.add_marker(pytest.mark.xdist_group("real_training"))
