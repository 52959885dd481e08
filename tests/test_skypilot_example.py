"""examples/skypilot.yaml and examples/skypilot-ray.yaml are tasks SkyPilot itself accepts (its
own YAML loader and schema, offline: nothing is launched). SkyPilot is an optional extra
(`.[cloud]`). What skypilot.yaml's `run` section does on the VM, preemption included, is
tests/test_skypilot_night.py; skypilot-ray.yaml's is run here with Ray's template and autoloop
replaced by scripts that note their calls (no cloud, no Ray cluster of SkyPilot's here)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "skypilot.yaml"


def test_the_skypilot_example_loads_with_skypilots_parser():
    sky = pytest.importorskip("sky", reason="SkyPilot is not installed (pip install -e '.[cloud]')")
    task = sky.Task.from_yaml(str(EXAMPLE))
    assert task.name == "autoloop" and task.workdir in (".", str(EXAMPLE.parent.parent), "./")
    assert "autoloop run" in task.run and "--resume" in task.run and "--proposer mutate" in task.run
    assert task.envs["HOURS"] == "8" and task.envs["BUDGET"] == "5m" and task.envs["AGENT"] == ""
    (resources,) = list(task.resources)
    assert resources.accelerators == {"H100": 1} and resources.use_spot
    # The night's bucket, mounted where the run section keeps the repo and results/ (the
    # bucket's name from the envs, as SkyPilot fills them in).
    (mount,) = task.storage_mounts
    storage = task.storage_mounts[mount]
    assert mount == task.envs["NIGHT"] == "/night" and storage.name == "my-autoloop-night", task.storage_mounts
    assert str(storage.mode).endswith("MOUNT_CACHED")
    assert set(task.secrets) >= {"ANTHROPIC_API_KEY", "OPENAI_API_KEY"}   # an agent's key, never in envs


RAY_EXAMPLE = EXAMPLE.with_name("skypilot-ray.yaml")


def test_the_skypilot_ray_example_loads_with_skypilots_parser():
    """A cluster of GPU nodes made one Ray cluster by SkyPilot's template, the night on rank 0
    against it: one trial per GPU of every node."""
    sky = pytest.importorskip("sky", reason="SkyPilot is not installed (pip install -e '.[cloud]')")
    task = sky.Task.from_yaml(str(RAY_EXAMPLE))
    assert task.name == "autoloop-ray" and task.num_nodes == 2
    (resources,) = list(task.resources)
    assert resources.accelerators == {"H100": 8} and not resources.use_spot
    envs = task.envs
    assert envs["RAY_HEAD_PORT"] != "6380"   # SkyPilot's own Ray
    assert int(envs["WORKERS"]) == task.num_nodes * 8 // int(envs["GPUS_PER_TRIAL"])
    assert "autoloop prepare" in task.setup and '"ray[default]' in task.setup   # on every node
    assert set(task.secrets) >= {"ANTHROPIC_API_KEY", "OPENAI_API_KEY"}


def run_section(task, home: Path, workdir: Path, rank: int) -> list[str]:
    """The run section in bash as SkyPilot runs it on the node of ``rank``, Ray's template and
    autoloop replaced by scripts that note how they were called; those calls."""
    calls = home / "calls"
    bin_dir = home / "bin"
    (home / "sky_templates" / "ray").mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(exist_ok=True)
    for path in (home / "sky_templates" / "ray" / "start_cluster", bin_dir / "autoloop"):
        path.write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> {calls}\n')
        path.chmod(0o755)
    env = {**os.environ, **{k: str(v) for k, v in task.envs.items()}, "HOME": str(home),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SKYPILOT_NODE_RANK": str(rank),
           "GIT_CONFIG_GLOBAL": str(home / ".gitconfig")}
    subprocess.run(["bash", "-c", task.run], cwd=workdir, env=env, check=True, capture_output=True, timeout=60)
    made = calls.read_text().splitlines() if calls.exists() else []
    calls.unlink(missing_ok=True)
    return made


def test_the_ray_examples_night_runs_on_rank_0_against_the_templates_head(tmp_path):
    sky = pytest.importorskip("sky", reason="SkyPilot is not installed (pip install -e '.[cloud]')")
    task = sky.Task.from_yaml(str(RAY_EXAMPLE))
    home, workdir = tmp_path / "home", tmp_path / "sky_workdir"
    home.mkdir()
    (workdir / ".git").mkdir(parents=True)
    (workdir / "train.py").write_text("print('val_bpb: 1.0')\n")
    # A worker node: Ray's template joins it to the head; no night there.
    assert run_section(task, home, workdir, rank=1) == ["start_cluster "]
    calls = run_section(task, home, workdir, rank=0)
    assert calls[0] == "start_cluster " and calls[-1] == "autoloop status", calls
    (night,) = [c for c in calls if c.startswith("autoloop run ")]
    assert night.startswith("autoloop run --executor ray --ray-address 127.0.0.1:6379 --tag sky-ray "), night
    assert "--workers 16 --gpus-per-trial 1 --proposer mutate" in night and "--resume" not in night, night
    assert (home / "autoloop-night" / "repo" / "train.py").exists()   # the night's own copy of the repo
    # Run again (`sky exec` after the head went away): the night goes on in its copy, resumed.
    (night,) = [c for c in run_section(task, home, workdir, rank=0) if c.startswith("autoloop run ")]
    assert night.endswith("--proposer mutate --resume"), night
