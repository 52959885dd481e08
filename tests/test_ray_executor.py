"""The ray executor's choices made before any trial, without a cluster: a trial's CPU share, a
trial too big for every node, the work tree too big for Ray's working_dir. (The executor on a
real cluster: tests/test_ray_cluster.py.)"""

from __future__ import annotations

import pytest

from autoloop.execution.executors import ExecutorError
from autoloop.execution.executors import ray_executor as rx


def node(gpus: float, cpus: float) -> dict:
    return {"NodeID": "x", "Alive": True, "Resources": {"GPU": gpus, "CPU": cpus} if gpus else {"CPU": cpus}}


def test_a_trial_asks_a_gpus_share_of_the_cpus_of_the_node_with_the_most_gpus():
    nodes = [node(0, 8), node(4, 16), node(8, 64)]
    assert rx.cpu_share(nodes, 2) == 16   # 64 CPUs / 8 GPUs, twice: four such trials fill the node
    assert rx.cpu_share(nodes, 0) == 1
    assert rx.cpu_share([node(4, 2)], 1) == 0.5   # fewer CPUs than GPUs: a fraction, never more than there is


def test_a_trial_bigger_than_every_node_is_one_line():
    rx.check_fits([node(0, 8), node(4, 16)], 4, "head:6379")
    with pytest.raises(ExecutorError, match=r"^--gpus-per-trial 5: no node of the Ray cluster at head:6379 has 5 "
                                            r"GPUs \(the most on one node: 4\); a trial runs on one node$"):
        rx.check_fits([node(0, 8), node(4, 16)], 5, "head:6379")


def test_a_trial_over_more_nodes_than_can_hold_a_share_is_one_line():
    """STRICT_SPREAD needs M distinct nodes each with the GPUs and the CPU share of one node's
    share; the head (no GPU) and a node short of CPUs do not count."""
    nodes = [node(0, 8), node(4, 16), node(4, 16), node(4, 1)]
    rx.check_fits(nodes, 2, "head:6379", count=2, cpus=8)
    with pytest.raises(ExecutorError, match=r"^--nodes-per-trial 3: the Ray cluster at head:6379 has 2 node\(s\) "
                                            r"of at least 2 GPU\(s\) and 8 CPU\(s\), and a trial needs 3 distinct "
                                            r"ones \(one per node\)$"):
        rx.check_fits(nodes, 2, "head:6379", count=3, cpus=8)


def test_the_work_tree_over_rays_working_dir_limit_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_bytes(b"x" * 3000)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "pack").write_bytes(b"x" * 10_000)   # left out of the package, as Ray is told
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "big.log").write_bytes(b"x" * 10_000)
    assert rx.working_dir_size(tmp_path) == 3000
    monkeypatch.setattr(rx, "working_dir_limit", lambda: 4096)
    assert "goes in Ray's runtime environment (working_dir" in rx.check_working_dir(tmp_path)
    (tmp_path / "data.bin").write_bytes(b"x" * 2000)
    with pytest.raises(ExecutorError, match="is over Ray's working_dir limit") as caught:
        rx.check_working_dir(tmp_path)
    assert "\n" not in str(caught.value)


def test_without_ray_the_executor_is_one_line(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ExecutorError, match=r"^--executor ray needs ray: pip install 'autoloop\[ray\]'"):
        rx.connect(None, "autoloop-x")


def test_a_node_that_dies_past_the_retries_is_the_clusters_end_not_the_changes(tmp_path):
    from autoloop.execution.executors.resubmit import with_resubmission
    from autoloop.execution.runner import RunOutcome

    log = tmp_path / "1-1.log"
    calls: list[int] = []

    def lost() -> RunOutcome:
        calls.append(1)
        log.write_text("step 1\n")
        return RunOutcome(log_path=log, job_error="ray actor t-1 lost its node",
                          job={"executor": "ray", "job_id": f"t-{len(calls)}", "job_state": "NODE_DIED (node died)"})

    outcome = with_resubmission(lost, log, None, retries=1, backoff=0)
    assert len(calls) == 2 and outcome.job["resubmitted"] == ["job t-1: NODE_DIED (node died)"]
    assert outcome.cluster_ended == "job t-2 lost its node (Ray: the node died) (submitted 2 times)"
    assert (tmp_path / "1-1.job-t-1.log").exists()   # the first try's log kept beside the second's
