"""`--track wandb` and `--track mlflow` on short real nights (real CLI, real git, the trackers'
offline modes: W&B offline files, MLflow's local SQLite store), read back with the trackers'
own tools: the runs carry the right config, metrics, status, crash class and diff."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.git import git
from helpers.loop import read_ledger
from helpers.watch import fake, fake_repo, queue, run_night

from autoloop.observe.trackers import loss_curve


def night_queue(repo: Path) -> None:
    queue(repo, "01_lower_a.py", fake(A=0.5), "lower a")
    queue(repo, "02_raise_b.py", fake(A=0.5, B=3.0), "raise b")
    queue(repo, "03_typo.py", fake(A=0.5).replace("print(\"---\")", "print(\"---\""), "typo")


def expected(repo: Path) -> dict[str, dict]:
    """label -> the ledger record, for the judged attempts."""
    out = {}
    for r in read_ledger(repo):
        if r["status"] != "skip":
            out[str(r["trial"]) + (f".{r['attempt']}" if r["attempt"] > 1 else "")] = r
    return out


def test_loss_curve_reads_progress_lines_and_thins_them():
    log = "\n".join(f"step {i:05d} ({i / 10:.1f}%) | loss: {5 - i / 1000:.4f} | lr 1" for i in range(1, 1001))
    points = loss_curve(log + "\n---\nval_bpb: 1.0\n", limit=100)
    assert len(points) == 100 and points[0] == (1, 4.999) and points[-1] == (1000, 4.0)
    assert loss_curve("no progress here\n") == []


# ------------------------------------------------------------------------------ W&B


def wandb_runs(results: Path) -> list[dict]:
    """Every offline W&B run under results/wandb, read back with `wandb leet inspect --json`:
    {"run": the run record, "history": [...], "summary": merged, "artifacts": [...], "exit": ...}."""
    runs = []
    for path in sorted((results / "wandb").glob("offline-run-*/run-*.wandb")):
        out = subprocess.run(["wandb", "leet", "inspect", "--json", str(path)], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        run = {"history": [], "summary": {}, "artifacts": [], "exit": None, "run": None}
        for line in out.splitlines():
            record = json.loads(line)
            kind = record.get("type")
            if kind == "run":
                run["run"] = record["run"]
            elif kind == "history":
                run["history"].append(record["history"]["item"])
            elif kind == "summary":
                run["summary"].update(record["summary"].get("update", {}))
            elif kind == "artifact":
                run["artifacts"].append(record["artifact"])
            elif kind == "exit":
                run["exit"] = record["exit"]
        runs.append(run)
    return runs


def test_wandb_offline_one_run_per_attempt_with_config_metrics_and_diff(tmp_path, tiny_data_dir):
    pytest.importorskip("wandb")
    if shutil.which("wandb") is None or subprocess.run(["wandb", "leet", "inspect", "--help"],
                                                       capture_output=True).returncode != 0:
        pytest.skip("no `wandb leet inspect` here to read offline runs back (wandb too old?)")
    repo = fake_repo(tmp_path)
    night_queue(repo)
    proc = run_night(repo, tiny_data_dir, "--track", "wandb",
                     env={"WANDB_MODE": "offline", "WANDB_PROJECT": "autoloop-test", "WANDB_SILENT": "true"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "track: each attempt goes to wandb (group autoloop/t)" in proc.stdout
    assert "warning" not in proc.stdout, proc.stdout
    want = expected(repo)
    runs = {r["run"]["display_name"].removeprefix("t #"): r for r in wandb_runs(repo / "results")}
    assert sorted(runs) == sorted(want)            # one run per judged attempt, none twice
    for label, run in runs.items():
        record = want[label]
        meta = run["run"]
        assert meta["project"] == "autoloop-test" and meta["run_group"] == "autoloop/t"
        config = meta["config"]["update"]
        if record["crash"] == "trivial":
            assert "A" not in config      # a target that does not parse has no constants to show
        else:
            source = git(repo, "show", f"{record['commit']}:train.py")
            assert config["A"] == float(source.split("A = ", 1)[1].split()[0])
            assert config["B"] in (2.0, 3.0) and config["HOLD"] is False
        assert config["autoloop"]["trial"] == record["trial"] and config["autoloop"]["commit"] == record["commit"]
        assert run["summary"]["status"] == record["status"]
        assert run["summary"]["crash"] == (record["crash"] or "-")
        if record["status"] == "crash":
            assert "val_bpb" not in run["summary"] and run["exit"]["exit_code"] == 1
        else:
            assert run["summary"]["val_bpb"] == pytest.approx(record["metric"])
            assert run["summary"]["training_seconds"] == pytest.approx(0.5)
            assert [h["train/loss"] for h in run["history"] if "train/loss" in h] == [3.0, 1.5, 1.0]
        if record["kind"] == "baseline":
            assert run["artifacts"] == []          # the baseline changed nothing
        else:
            [artifact] = run["artifacts"]
            assert artifact["type"] == "diff" and artifact["name"] == f"diff-t-{record['trial']}-{record['attempt']}"
    # nothing landed in the work tree (the loop keeps it clean; wandb's files are in results/)
    assert git(repo, "status", "--porcelain") == ""


# ------------------------------------------------------------------------------ MLflow


def mlflow_runs(results: Path, uri: str | None = None) -> tuple[object, list]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri or f"sqlite:///{results / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("autoloop/t")
    assert experiment is not None
    return client, client.search_runs([experiment.experiment_id], max_results=1000)


def test_mlflow_local_store_one_run_per_attempt_with_params_metrics_and_diff(tmp_path, tiny_data_dir):
    pytest.importorskip("mlflow")
    repo = fake_repo(tmp_path)
    night_queue(repo)
    env = {k: "" for k in ("MLFLOW_TRACKING_URI",)}
    proc = run_night(repo, tiny_data_dir, "--track", "mlflow", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning" not in proc.stdout, proc.stdout
    want = expected(repo)
    client, runs = mlflow_runs(repo / "results")
    by_label = {r.info.run_name.removeprefix("t #"): r for r in runs}
    assert sorted(by_label) == sorted(want)
    for label, run in by_label.items():
        record = want[label]
        assert run.data.tags["status"] == record["status"]
        assert run.data.tags["crash"] == (record["crash"] or "-")
        assert run.data.params["autoloop.commit"] == str(record["commit"])
        if record["crash"] != "trivial":   # a target that does not parse has no constants to show
            source = git(repo, "show", f"{record['commit']}:train.py")
            assert run.data.params["A"] == source.split("A = ", 1)[1].split()[0]
        assert run.info.status == ("FAILED" if record["status"] == "crash" else "FINISHED")
        if record["status"] != "crash":
            assert run.data.metrics["val_bpb"] == pytest.approx(record["metric"])
            losses = client.get_metric_history(run.info.run_id, "train_loss")
            assert sorted((m.step, m.value) for m in losses) == [(1, 3.0), (2, 1.5), (3, 1.0)]
        if record["kind"] != "baseline":
            path = client.download_artifacts(run.info.run_id, "diff.patch", str(tmp_path / label))
            diff = subprocess.run(["git", "diff", record["parent"], record["commit"]], cwd=repo,
                                  capture_output=True, text=True, check=True).stdout
            assert Path(path).read_text() == diff
    assert git(repo, "status", "--porcelain") == ""


def test_a_failing_tracker_is_one_warning_and_the_next_start_catches_up(tmp_path, tiny_data_dir):
    """MLflow pointed at a store it cannot create: the night runs to the end with one warning
    line; a resumed run with a working store logs every attempt the first one missed."""
    pytest.importorskip("mlflow")
    repo = fake_repo(tmp_path)
    queue(repo, "01_lower_a.py", fake(A=0.5), "lower a")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store's folder would be\n")
    proc = run_night(repo, tiny_data_dir, "--track", "mlflow",
                     env={"MLFLOW_TRACKING_URI": f"sqlite:///{blocker}/mlflow.db"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = [line for line in proc.stdout.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "--track mlflow: cannot start" in warnings[0], proc.stdout
    assert "no more ideas" in proc.stdout
    assert [r["status"] for r in read_ledger(repo)] == ["keep", "keep"]

    good = f"sqlite:///{tmp_path / 'store.db'}"
    queue(repo, "02_raise_b.py", fake(A=0.5, B=3.0), "raise b")
    proc = run_night(repo, tiny_data_dir, "--track", "mlflow", "--resume", env={"MLFLOW_TRACKING_URI": good})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "track: 2 recorded attempt(s) not yet in mlflow; logging them" in proc.stdout
    _, runs = mlflow_runs(repo / "results", good)
    assert sorted(r.info.run_name for r in runs) == ["t #0", "t #1", "t #2"]


def test_a_tracker_that_is_not_installed_is_a_one_line_error(tmp_path, tiny_data_dir):
    repo = fake_repo(tmp_path)
    shadow = tmp_path / "shadow"
    (shadow / "wandb").mkdir(parents=True)
    (shadow / "wandb" / "__init__.py").write_text("raise ImportError('no wandb here')\n")
    import os

    env = {"PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])}
    proc = run_night(repo, tiny_data_dir, "--track", "wandb", env=env)
    assert proc.returncode == 1
    assert proc.stderr == "autoloop: --track wandb: wandb is not installed (pip install 'autoloop[wandb]')\n"
    assert not (repo / "results" / "ledger.jsonl").exists()   # nothing ran

    proc = run_night(repo, tiny_data_dir, "--track", "neptune")
    assert proc.returncode == 1 and proc.stderr == "autoloop: --track: must be 'wandb' or 'mlflow', got 'neptune'\n"
