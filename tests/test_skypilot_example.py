"""examples/skypilot.yaml is a task SkyPilot itself accepts (its own YAML loader and schema,
offline: nothing is launched). SkyPilot is an optional extra (`.[cloud]`)."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "skypilot.yaml"


def test_the_skypilot_example_loads_with_skypilots_parser():
    sky = pytest.importorskip("sky", reason="SkyPilot is not installed (pip install -e '.[cloud]')")
    task = sky.Task.from_yaml(str(EXAMPLE))
    assert task.name == "autoloop" and task.workdir in (".", str(EXAMPLE.parent.parent), "./")
    assert "autoloop run" in task.run and "--resume" in task.run
    assert task.envs["HOURS"] == "8" and task.envs["BUDGET"] == "5m"
    (resources,) = list(task.resources)
    assert resources.accelerators == {"H100": 1}
