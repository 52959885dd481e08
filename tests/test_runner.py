"""The runner on real processes: tiny trial programs from tests/trial_scripts/ that fail in
one specific way each, run through run_process and classified from what actually happened."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import psutil
import pytest

from autoloop.core.classify import classify
from autoloop.execution.runner import (
    TAIL_BYTES,
    RunOutcome,
    RunSpec,
    build_env,
    default_command,
    default_timeout,
    run_process,
)

SCRIPTS = Path(__file__).parent / "trial_scripts"


def spec_for(tmp_path: Path, script: str, *args: str, **fields) -> RunSpec:
    fields = {"timeout_s": 60.0, "grace_s": 1.0, "sample_interval_s": 0.05, **fields}
    return RunSpec(command=[sys.executable, str(SCRIPTS / script), *args], cwd=tmp_path,
                     log_path=tmp_path / "runs" / f"{script}.log", **fields)


def run(tmp_path: Path, script: str, *args: str, **fields) -> RunOutcome:
    return run_process(spec_for(tmp_path, script, *args, **fields))


def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def trial_children(script: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if any(script in part for part in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            pass
    return found


# ---------------------------------------------------------------------------------
# Each failure, for real, classified with a reason naming its evidence.

@pytest.mark.parametrize("script, kind, evidence", [
    ("syntax_error.py", "trivial", "SyntaxError: invalid syntax (syntax_error.py:4)"),
    ("indentation_error.py", "trivial", "IndentationError: unexpected indent (indentation_error.py:3)"),
    ("name_error.py", "trivial", "NameError: name 'lr' is not defined (name_error.py:5)"),
    ("import_error.py", "trivial",
     "ModuleNotFoundError: No module named 'autoloop_no_such_module' (import_error.py:2)"),
    ("attribute_error.py", "trivial", "AttributeError: module 'math' has no attribute 'tau2'"),
    ("type_error.py", "trivial", "TypeError: object of type 'int' has no len() (type_error.py:2)"),
    ("shape_mismatch.py", "trivial",
     "shape mismatch: RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6) (shape_mismatch.py:6)"),
    ("exit0_no_metric.py", "trivial", "no val_bpb reported"),
    ("nan_fail.py", "fundamental", "FAIL: loss is nan at step 3"),
    ("segfault.py", "fundamental", "killed by SIGSEGV"),
])
def test_real_failures_are_classified_with_their_evidence(tmp_path, script, kind, evidence):
    outcome = run(tmp_path, script)
    verdict = classify(outcome)
    assert verdict.kind == kind, (verdict, outcome.log_tail)
    assert evidence in verdict.reason
    assert "\n" not in verdict.reason and len(verdict.reason) <= 200
    assert outcome.log_path.read_text().rstrip("\n") == outcome.log_tail  # small logs: all of it


def test_segfault_leaves_a_python_stack_in_the_log(tmp_path):
    outcome = run(tmp_path, "segfault.py")
    assert outcome.signal == signal.SIGSEGV and outcome.exit_code is None
    assert "Fatal Python error: Segmentation fault" in outcome.log_tail  # PYTHONFAULTHANDLER


def test_memory_cap_kills_the_hog(tmp_path):
    outcome = run(tmp_path, "memory_hog.py", max_rss_gb=0.3)
    assert outcome.killed_reason == "max_rss" and outcome.max_rss_gb == 0.3
    assert 0.3 * 1024 < outcome.peak_rss_mb < 1024  # crossed the cap, stopped long before 1 GiB
    assert "nobody stopped me" not in outcome.log_path.read_text()
    verdict = classify(outcome)
    assert verdict.kind == "fundamental"
    assert verdict.reason.startswith("host memory cap 0.3 GiB exceeded (peak 0.")


def test_sigkill_from_outside_is_fundamental(tmp_path):
    spec = spec_for(tmp_path, "sleeper.py")

    def oom_killer():
        wait_for(lambda: spec.log_path.exists() and "ready" in spec.log_path.read_text())
        for proc in trial_children("sleeper.py"):
            proc.send_signal(signal.SIGKILL)

    killer = threading.Thread(target=oom_killer)
    killer.start()
    outcome = run_process(spec)
    killer.join()
    assert outcome.signal == signal.SIGKILL and outcome.killed_reason is None
    assert classify(outcome) == ("fundamental", "killed by SIGKILL (likely the host out-of-memory killer)")
    assert outcome.wall_seconds < 20


def test_infinite_loop_times_out(tmp_path):
    outcome = run(tmp_path, "infinite_loop.py", timeout_s=1.5)
    assert outcome.timed_out and outcome.killed_reason == "timeout"
    assert outcome.signal == signal.SIGTERM
    assert 1.5 <= outcome.wall_seconds < 8
    assert classify(outcome) == ("timeout", "hard timeout 1.5 s exceeded")
    assert "[autoloop] hard timeout of 1.5 s exceeded" in outcome.log_path.read_text()


def test_sigterm_ignored_means_sigkill_after_grace(tmp_path):
    outcome = run(tmp_path, "ignores_sigterm.py", timeout_s=1.0, grace_s=0.5)
    assert outcome.timed_out and outcome.signal == signal.SIGKILL
    assert 1.5 <= outcome.wall_seconds < 8
    assert not trial_children("ignores_sigterm.py")


def test_daemon_grandchild_does_not_outlive_the_trial(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    outcome = run(tmp_path, "daemon_grandchild.py", str(pid_file), grace_s=0.5)
    grandchild = int(pid_file.read_text())
    assert outcome.exit_code == 0 and outcome.metric == 1.5
    assert outcome.leftover_processes >= 1
    assert not psutil.pid_exists(grandchild)
    assert "still running after the main process ended" in outcome.log_tail


def test_stop_event_ends_the_tree(tmp_path):
    stop = threading.Event()
    spec = spec_for(tmp_path, "sleeper.py")
    threading.Thread(target=lambda: (wait_for(lambda: spec.log_path.exists()
                                              and "ready" in spec.log_path.read_text()), stop.set())).start()
    started: list[list[tuple[int, float]]] = []
    outcome = run_process(spec, stop_event=stop, on_start=started.append)
    assert outcome.killed_reason == "stopped" and outcome.signal == signal.SIGTERM
    [[(pid, created)]] = started  # the main process, once, for recovery after a crash of the orchestrator
    assert not psutil.pid_exists(pid) and created <= outcome.ended_at
    assert classify(outcome) == ("fundamental", "interrupted")
    assert outcome.wall_seconds < 20


def test_command_not_found_is_an_outcome_not_a_traceback(tmp_path):
    outcome = run_process(RunSpec(command="autoloop-no-such-command train.py", cwd=tmp_path,
                                  log_path=tmp_path / "x.log"))
    assert outcome.exit_code == 127 and outcome.launch_error == "command not found: autoloop-no-such-command"
    assert classify(outcome) == ("fundamental", "command not found: autoloop-no-such-command")
    assert "command not found" in (tmp_path / "x.log").read_text()


def test_missing_workspace_is_an_outcome(tmp_path):
    outcome = run_process(RunSpec(cwd=tmp_path / "gone", log_path=tmp_path / "x.log"))
    assert outcome.launch_error == f"workspace not found: {tmp_path / 'gone'}"


# ---------------------------------------------------------------------------------
# Reading the metric.

def test_success_reads_the_result_file_of_autoloop_evaluate(tmp_path):
    result = tmp_path / "results" / "trial.json"
    outcome = run(tmp_path, "report_metric.py", "evaluate", "1.250000", result_path=result,
                  env={"AUTOLOOP_NONCE": "n0nce"})
    assert outcome.metric == 1.25 and outcome.metric_error is None
    assert outcome.result["fingerprint"] == "test-fingerprint" and outcome.result["nonce"] == "n0nce"
    assert outcome.summary == {"val_bpb": 1.25, "training_seconds": 2.0, "peak_vram_mb": 123.4, "num_steps": 100}
    assert classify(outcome) == ("ok", "val_bpb 1.250000")


def test_stdout_only_metric_for_a_foreign_script(tmp_path):
    outcome = run(tmp_path, "report_metric.py", "-", "1.23", result_path=tmp_path / "r.json")
    assert outcome.metric == 1.23 and outcome.result is None and outcome.metric_error is None
    assert classify(outcome).kind == "ok"


def test_stale_result_file_is_never_read(tmp_path):
    stale = tmp_path / "r.json"
    stale.write_text(json.dumps({"metric": "val_bpb", "value": 0.5, "val_bpb": 0.5}))
    outcome = run(tmp_path, "report_metric.py", "-", "1.23", result_path=stale)
    assert outcome.metric == 1.23 and not stale.exists()


def test_result_within_print_rounding_agrees(tmp_path):
    outcome = run(tmp_path, "report_metric.py", "1.2345674", "1.234567", result_path=tmp_path / "r.json")
    assert outcome.metric == 1.2345674 and outcome.metric_error is None


@pytest.mark.parametrize("args, env, error", [
    (("1.25", "1.300000"), {}, "result file val_bpb 1.250000 disagrees with stdout 1.300000"),
    (("-", "nan"), {}, "val_bpb is nan"),
    (("nan", "-"), {}, "val_bpb is nan"),
    (("1.25", "1.250000", "someone-else"), {"AUTOLOOP_NONCE": "n0nce"}, "result nonce mismatch"),
    (("1.25", "1.250000", ""), {"AUTOLOOP_NONCE": "n0nce"}, "result file has no nonce"),
    (("garbage", "1.250000"), {}, "result file unreadable: "),
])
def test_unusable_metric_is_a_fundamental_failure(tmp_path, args, env, error):
    outcome = run(tmp_path, "report_metric.py", *args, result_path=tmp_path / "r.json", env=env)
    assert outcome.exit_code == 0 and outcome.metric is None
    assert outcome.metric_error.startswith(error)
    assert classify(outcome) == ("fundamental", outcome.metric_error)


def test_required_result_file_refuses_a_stdout_only_metric(tmp_path):
    outcome = run(tmp_path, "report_metric.py", "-", "0.100000", result_path=tmp_path / "r.json",
                  require_result=True)
    assert outcome.metric is None and outcome.metric_error.startswith("no result file from autoloop.evaluate")
    assert classify(outcome)[0] == "fundamental"   # a number evaluate never wrote is not trusted


def test_required_result_file_missing_with_nothing_reported_is_a_fixable_bug(tmp_path):
    """An edit that skips the evaluation (an early sys.exit(0)): trivial, so an agent gets a fix request."""
    outcome = run(tmp_path, "exit0_no_metric.py", result_path=tmp_path / "r.json", require_result=True)
    assert outcome.exit_code == 0 and outcome.metric is None and outcome.metric_error is None
    assert classify(outcome) == ("trivial", "no val_bpb reported")


# ---------------------------------------------------------------------------------
# Streaming, and a trial that floods its output.

def test_log_streams_and_progress_is_reported_while_running(tmp_path):
    spec = spec_for(tmp_path, "streaming.py")
    seen: list[tuple[str, int]] = []

    def on_progress(line: str) -> None:
        seen.append((line, spec.log_path.stat().st_size))
        if len(seen) == 1:
            raise RuntimeError("a broken progress display must not end the trial")

    outcome = run_process(spec, on_progress=on_progress)
    expected = [f"step {i:05d} ({25 * i:.1f}%) | loss: {5.0 / i:.4f}" for i in range(1, 5)]
    lines = [line for line, _ in seen]
    # One call per read; lines 0.3 s apart arrive in reads of their own unless the machine stalls.
    assert len(lines) >= 2 and lines == sorted(lines) and set(lines) <= set(expected) and lines[-1] == expected[-1]
    sizes = [size for _, size in seen]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1] < outcome.log_path.stat().st_size
    assert outcome.metric == 1.5 and outcome.last_progress == seen[-1][0]


def test_flood_of_output_is_drained_promptly_with_a_bounded_tail(tmp_path):
    tracemalloc.start()
    try:
        started = time.monotonic()
        outcome = run(tmp_path, "flood.py")
        elapsed = time.monotonic() - started
        _, peak_python_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outcome.exit_code == 0 and outcome.metric == 1.75
    assert outcome.log_path.stat().st_size >= 200 * 2**20
    assert len(outcome.log_tail) <= TAIL_BYTES + 1024
    assert peak_python_bytes < 16 * 2**20  # the night's log is never held in memory
    assert elapsed < 20


# ---------------------------------------------------------------------------------
# The environment contract.

ENV_PROBE = ("import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
             "if k.startswith(('AUTOLOOP_', 'PYTHON'))}))")


def test_child_gets_the_environment_contract(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOLOOP_RESULT", "/somewhere/else.json")  # inherited: must not leak through
    env = build_env(2.5, 7, tmp_path / "r.json", data_dir=tmp_path / "data", device="cpu", nonce="abc")
    outcome = run_process(RunSpec(command=[sys.executable, "-c", ENV_PROBE], cwd=tmp_path, env=env,
                                  result_path=Path("r.json"), log_path=tmp_path / "env.log"))
    seen = json.loads(outcome.log_tail.splitlines()[0])
    assert seen["AUTOLOOP_BUDGET_S"] == "2.5" and seen["AUTOLOOP_SEED"] == "7"
    assert seen["AUTOLOOP_RESULT"] == str(tmp_path / "r.json")  # relative result_path: under cwd
    assert seen["AUTOLOOP_DATA_DIR"] == str(tmp_path / "data") and seen["AUTOLOOP_DEVICE"] == "cpu"
    assert seen["AUTOLOOP_NONCE"] == "abc" and seen["PYTHONUNBUFFERED"] == "1"
    assert len(seen["AUTOLOOP_TRIAL_TOKEN"]) == 32
    assert seen["AUTOLOOP_TIMEOUT_S"] == "600"   # the limit in force: default_timeout of the spec's 300 s budget

    outcome = run_process(RunSpec(command=[sys.executable, "-c", ENV_PROBE], cwd=tmp_path,
                                  log_path=tmp_path / "env2.log"))
    assert "AUTOLOOP_RESULT" not in json.loads(outcome.log_tail.splitlines()[0])


def test_build_env_leaves_unset_values_to_train_py():
    assert build_env(300.0, 42, None) == {"AUTOLOOP_BUDGET_S": "300", "AUTOLOOP_SEED": "42", "PYTHONUNBUFFERED": "1"}
    with pytest.raises(ValueError, match="budget must be positive"):
        build_env(0, 42, None)


def test_defaults():
    assert default_timeout(300) == 600 and default_timeout(60) == 180
    assert default_command() == [sys.executable, "train.py"]
    spec = RunSpec(command="uv run train.py", cwd=Path("."), log_path=Path("x.log"))
    assert spec.command == ["uv", "run", "train.py"]
    with pytest.raises(ValueError):
        RunSpec(command=[], cwd=Path("."), log_path=Path("x.log"))
