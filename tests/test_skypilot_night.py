"""examples/skypilot.yaml's `run` section, executed as SkyPilot runs it on the VM (bash, in the
synced workdir, with the task's envs), against a local folder standing in for the mounted
bucket; a preemption is a kill -9 of the whole night, and the recovered VM runs the section
again: the night resumes from the bucket and nothing recorded before the kill is lost.
(That the YAML is a task SkyPilot accepts is tests/test_skypilot_example.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml
from helpers.cluster_night import wait_for
from helpers.git import init_repo
from helpers.loop import assert_invariants, loop_env

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "skypilot.yaml"

# A stand-in train.py with one constant the mutator (the example's default proposer) moves;
# each trial takes long enough for the kill to land in one.
# It reports as autoloop.evaluate does: the line on stdout and a result file with the trial's nonce.
TRAIN = ("import json, os, time\n\nLR = 0.01  # the learning rate\n\ntime.sleep(1.0)\n"
         "VALUE = 1.0 + abs(LR - 0.05)\nprint('---')\nprint(f'val_bpb: {VALUE:.6f}')\n"
         "with open(os.environ['AUTOLOOP_RESULT'], 'w') as f:\n"
         "    json.dump({'val_bpb': VALUE, 'nonce': os.environ['AUTOLOOP_NONCE']}, f)\n")


def section_env(tmp_path: Path, data_dir: Path, bucket: Path) -> dict[str, str]:
    task = yaml.safe_load(EXAMPLE.read_text())
    shims = tmp_path / "bin"
    shims.mkdir(exist_ok=True)
    (shims / "autoloop").write_text(f"#!/bin/sh\nexec {sys.executable} -m autoloop.cli \"$@\"\n")
    (shims / "autoloop").chmod(0o755)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {**os.environ, **{k: str(v) for k, v in task["envs"].items()}, **loop_env(data_dir),
            "NIGHT": str(bucket), "HOME": str(home), "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "BUDGET": "1", "AUTOLOOP_ARGS": "--noise-runs 0 --sanity-bound 0 --no-machine-probe --timeout 60 "
                                            "--max-trials 3"}


def start_section(workdir: Path, env: dict[str, str]) -> subprocess.Popen:
    run = yaml.safe_load(EXAMPLE.read_text())["run"]
    return subprocess.Popen(["bash", "-c", run], cwd=workdir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def ledger_lines(repo: Path) -> list[str]:
    path = repo / "results" / "ledger.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def in_flight(repo: Path) -> bool:
    try:
        return json.loads((repo / "results" / "state.json").read_text()).get("phase") == "running"
    except (OSError, ValueError):
        return False


def test_the_skypilot_night_resumes_from_the_bucket_after_a_preemption(tmp_path, tiny_data_dir):
    workdir = init_repo(tmp_path / "workdir", {"train.py": TRAIN})   # what SkyPilot syncs to the VM
    bucket = tmp_path / "bucket"
    env = section_env(tmp_path, tiny_data_dir, bucket)
    night_repo = bucket / "repo"
    first = start_section(workdir, env)
    try:
        wait_for("a trial to run after the baseline", lambda: first.poll() is not None or (
            len(ledger_lines(night_repo)) >= 2 and in_flight(night_repo)), 240)
        assert first.poll() is None, first.communicate()[0]
        os.killpg(first.pid, signal.SIGKILL)   # the spot VM is gone, with every process on it
        first.wait(30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    before = ledger_lines(night_repo)
    assert not (bucket / "home").exists()
    # The recovered VM: a new sync of the same workdir (unchanged: the night ran on the bucket).
    assert subprocess.run(["git", "status", "--porcelain"], cwd=workdir, capture_output=True,
                          text=True).stdout == ""
    second = start_section(workdir, env)
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out
    after = ledger_lines(night_repo)
    assert after[:len(before)] == before, "a record from before the preemption was lost or changed"
    ledger = assert_invariants(night_repo, tag="sky")
    assert any(r["reason"].startswith("interrupted") for r in ledger), ledger   # the trial the kill cut off
    assert "proposer mutate" in out, out
    assert len(ledger) > len(before)
    # Home: the branch in a bundle and results/ beside it, for `git fetch` on the person's machine.
    heads = subprocess.run(["git", "bundle", "list-heads", str(bucket / "home" / "autoloop.bundle")],
                           capture_output=True, text=True, check=True).stdout
    best = [r["best"] for r in ledger if r["best"]][-1]
    assert f"{best} refs/heads/autoloop/sky" in heads, heads
    home_ledger = (bucket / "home" / "results" / "ledger.jsonl").read_text().splitlines()
    assert home_ledger == after
    # ... fetched as the YAML's header says, into the person's own checkout (the workdir here).
    subprocess.run(["git", "fetch", "-q", str(bucket / "home" / "autoloop.bundle"),
                    "refs/heads/autoloop/*:refs/heads/autoloop/*", "refs/autoloop/*:refs/autoloop/*"],
                   cwd=workdir, check=True, capture_output=True)
    fetched = subprocess.run(["git", "rev-parse", "autoloop/sky"], cwd=workdir, capture_output=True, text=True)
    assert fetched.stdout.strip() == best
    for record in ledger:   # every trial's commit came home too
        if record["commit"]:
            subprocess.run(["git", "cat-file", "-e", record["commit"]], cwd=workdir, check=True)
