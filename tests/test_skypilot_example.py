"""examples/skypilot.yaml is a task SkyPilot itself accepts (its own YAML loader and schema,
offline: nothing is launched). SkyPilot is an optional extra (`.[cloud]`). What its `run`
section does on the VM, preemption included, is tests/test_skypilot_night.py."""

from __future__ import annotations

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
