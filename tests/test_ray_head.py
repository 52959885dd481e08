"""The Ray cluster's head lost under a night (autoloop/execution/executors/ray_head.py), on a real
cluster of its own (a head and one worker node, tests/ray_cluster.py): the session's shared
cluster is not the one killed here, other tests use it.

Ray's limit for a driver without its head (``RAY_gcs_rpc_server_reconnect_timeout_s``) is set
to 15 s for the cluster and the orchestrator alike: the night's own limit (a third of it) passes
in 5 s, and with Ray's shutdown without its head (5 s) the night has ended before Ray's 15 s.
What is shown is that the night stops, in its own line, before Ray would end the process.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest
from helpers.cluster_night import fake_train, start_autoloop, wait_for
from helpers.git import init_repo
from helpers.loop import assert_invariants, autoloop, queue_file
from ray_cluster import RayCluster, require_ray

from autoloop.execution.executors.ray_head import HeadGone, HeadWatch, ray_reconnect_s

# With the other Ray tests (one worker, one cluster started at a time; distinct worker ports).
pytestmark = pytest.mark.xdist_group("ray_cluster")
RECONNECT_S = "15"   # Ray's own limit for the driver, here; the night waits a third of it


@pytest.fixture
def own_cluster():
    """A head and one worker node for this test alone (the test kills its head)."""
    require_ray()
    cluster = RayCluster(workers=1)   # its own short temp dir: Ray's socket paths have a length limit
    cluster.env["RAY_gcs_rpc_server_reconnect_timeout_s"] = RECONNECT_S
    try:
        yield cluster.start()
    finally:
        for name in list(cluster.procs):   # a cluster of this test alone: SIGKILL, no orderly stop
            cluster.kill_node(name)
        cluster.stop()
        shutil.rmtree(cluster.dir, ignore_errors=True)


def night(*extra: str) -> list[str]:
    return ["run", "--budget", "2", "--timeout", "60", "--proposer", "queue", "--tag", "t", "--device", "cpu",
            "--command", f"{sys.executable} train.py", "--executor", "ray", "--gpus-per-trial", "1",
            "--noise-runs", "0", "--sanity-bound", "0", *extra]


def first_run_hangs(runs: Path, marker: Path) -> str:
    """Hangs on its first run (its pid in ``marker``); the run after it reports 0.8."""
    return fake_train(0.8, f"import os, pathlib, time\np = pathlib.Path({str(runs)!r})\n"
                           "n = len(p.read_text()) if p.exists() else 0\np.write_text('x' * (n + 1))\n"
                           f"if n == 0:\n    pathlib.Path({str(marker)!r}).write_text(str(os.getpid()))\n"
                           "    time.sleep(300)\n")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


def test_the_heads_loss_stops_the_night_in_one_line_and_resume_runs_the_trial_again(
        tmp_path, tiny_data_dir, own_cluster, monkeypatch):
    cluster = own_cluster
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    monkeypatch.setenv("RAY_gcs_rpc_server_reconnect_timeout_s", RECONNECT_S)
    runs, marker, out = tmp_path / "runs.txt", tmp_path / "started", tmp_path / "night.out"
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01_hangs.py", first_run_hangs(runs, marker), "hangs once")
    orchestrator = start_autoloop(repo, tiny_data_dir, night(), out)
    try:
        wait_for("the trial to run", lambda: marker.exists() or orchestrator.poll() is not None)
        assert marker.exists(), out.read_text()
        trial = int(marker.read_text())
        cluster.kill_node("head")   # its whole session: the GCS and the head's raylet
        rc = orchestrator.wait(120)
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
    said = out.read_text()
    last = said.strip().splitlines()[-1]
    assert rc == 75, said
    port = cluster.address.rsplit(":", 1)[1]   # Ray names the head by its node address, not 127.0.0.1
    assert last.startswith("autoloop: the Ray cluster's head at ") and f":{port} is gone (no answer for " in last, said
    assert last.endswith("autoloop run --resume continues once the head is back"), said
    assert "Traceback" not in said and "internal error" not in said and "Failed to connect to GCS" not in said, said
    wait_for("the trial's tree to end on its node", lambda: not alive(trial), timeout=60)
    # Nothing lost: the baseline recorded, the attempt still in flight for --resume to finish.
    assert [r["description"] for r in assert_invariants(repo)] == ["baseline"]
    state = json.loads((repo / "results" / "state.json").read_text())
    assert state["phase"] == "running" and state["job"]["executor"] == "ray", state

    # The head back at its address: a new cluster (no GCS fault tolerance), a new worker node
    # joined (the old one's raylet gives up on the old head by itself at Ray's limit, as measured;
    # killed here rather than waited for, as a pod or VM restarted). --resume finds the actor gone
    # with the old cluster and runs the trial again.
    cluster.kill_node("worker1")
    cluster.start_head()
    cluster.start_worker("worker2")
    resumed = autoloop(repo, *night("--resume"), data_dir=tiny_data_dir, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "recovery: trial 1.1 was interrupted during running" in resumed.stdout, resumed.stdout
    assert "#1: running attempt 1.1 again" in resumed.stdout, resumed.stdout
    records = [r for r in assert_invariants(repo) if r["trial"] == 1]
    assert [(r["attempt"], r["status"]) for r in records] == [(1, "crash"), (2, "keep")], records
    assert records[0]["reason"] == "interrupted (orchestrator stopped during running)", records[0]
    assert records[1]["metric"] == 0.8 and runs.read_text() == "xx", records[1]



def test_the_head_is_called_gone_only_once_it_stays_silent_past_the_limit(monkeypatch):
    """A third of Ray's limit (RAY_gcs_rpc_server_reconnect_timeout_s, 60 s by default) without
    an answer; a head that answers again before it is not gone; once gone, gone."""
    assert ray_reconnect_s({}) == 60 and ray_reconnect_s({"RAY_gcs_rpc_server_reconnect_timeout_s": "12"}) == 12
    monkeypatch.delenv("RAY_gcs_rpc_server_reconnect_timeout_s", raising=False)
    assert HeadWatch("127.0.0.1:1").gone_after_s == 20
    head = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{head.getsockname()[1]}"
    watch = HeadWatch(address, gone_after_s=0.5)
    deadline = time.monotonic() + 1.5   # past the limit and a probe's interval
    while time.monotonic() < deadline:   # it answers: never gone, however long
        watch.check()
        time.sleep(0.1)
    head.close()
    with pytest.raises(HeadGone) as gone:
        for _ in range(100):
            watch.check()
            time.sleep(0.1)
    assert gone.value.exit_status == 75 and f"head at {address} is gone" in str(gone.value)
    assert str(gone.value).endswith("autoloop run --resume continues once the head is back")
    with socket.create_server(("127.0.0.1", int(address.rsplit(":", 1)[1]))), pytest.raises(HeadGone):
        watch.check()   # a head back at the address is a new cluster: the night still stops
