"""Resources and isolation: the run-log cap, the free-disk stop, a flooding trial, --isolate.

Real processes throughout: trial scripts from tests/trial_scripts/ through run_process, and the
real CLI on real git repos with a foreign ``--command`` (no torch) for the loop-level tests.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers.git import git, init_repo
from helpers.loop import assert_invariants, autoloop, read_tsv, run_args

from autoloop.core.classify import classify
from autoloop.execution import isolate
from autoloop.execution.diskspace import low_disk_reason
from autoloop.execution.runner import RunSpec, run_process
from autoloop.store.runlog import LINE_WINDOW, PIECE_INFIX, RunLog, finish_log

SCRIPTS = Path(__file__).parent / "trial_scripts"
MARKER = re.compile(rb"\[autoloop: (\d+) bytes(?: \((\d+) lines\))? of output cut here\]\n")


def spec_for(tmp_path: Path, script: str, *args: str, **fields) -> RunSpec:
    fields = {"timeout_s": 120.0, "grace_s": 1.0, "sample_interval_s": 0.05, **fields}
    return RunSpec(command=[sys.executable, str(SCRIPTS / script), *args], cwd=tmp_path,
                     log_path=tmp_path / "runs" / f"{script}.log", **fields)


def split_capped(log: bytes, output: bytes) -> tuple[bytes, int, int | None, bytes]:
    """(head, bytes cut, lines cut, tail) of a capped log, checked against the full output."""
    found = MARKER.search(log)
    assert found, log[:300]
    head, tail, cut = log[:found.start()], log[found.end():], int(found.group(1))
    if len(head) != len(output) - cut - len(tail):  # a newline added so the marker has a line of its own
        assert head.endswith(b"\n")
        head = head[:-1]
    assert output.startswith(head) and output.endswith(tail)
    assert len(head) + cut + len(tail) == len(output)
    return head, cut, int(found.group(2)) if found.group(2) else None, tail


def pieces_of(log_path: Path) -> list[Path]:
    return sorted(log_path.parent.glob(log_path.name + PIECE_INFIX + "*"))


def foreign_repo(tmp_path: Path, train_py: str) -> Path:
    return init_repo(tmp_path / "repo", {"train.py": train_py})


def foreign_run_args(*extra: str) -> list[str]:
    return [*run_args(), "--command", f"{sys.executable} train.py", *extra]


# ---------------------------------------------------------------------------------
# The log cap, on the log itself.

@pytest.mark.parametrize("seed", range(4))
def test_capped_log_keeps_head_and_tail_and_counts_what_was_cut(tmp_path, seed):
    rng = random.Random(seed)
    for case in range(40):
        cap = rng.choice([1000, 4096, 65536, 300_000])
        size = rng.choice([cap // 2, cap, cap + 1, 3 * cap, rng.randrange(1, 12 * cap)])
        text = b""
        while len(text) < size:  # mostly lines, now and then a line longer than the cut window
            text += (b"x" * rng.randrange(0, 200) + b"\n") if rng.random() < 0.9 else b"y" * rng.randrange(0, 9000)
        output = text[:size]
        path = tmp_path / f"{seed}-{case}.log"
        log = RunLog(path, cap)
        i = 0
        while i < len(output):  # reads of any size, as from a pipe
            step = rng.randrange(1, 3 * cap)
            log.write(output[i:i + step])
            i += step
        log.close()
        data = path.read_bytes()
        assert pieces_of(path) == [] and not path.with_name(path.name + ".part").exists()
        if len(output) <= cap:
            assert data == output and log.cut_bytes == 0
            continue
        head, cut, lines, tail = split_capped(data, output)
        assert log.cut_bytes == cut and lines == output[len(head):len(output) - len(tail)].count(b"\n")
        half, window = cap // 2, min(LINE_WINDOW, (cap - cap // 2) // 8)
        assert half - window <= len(head) <= half and cap - half - window - 1 <= len(tail) <= cap - half
        if b"\n" in output[half - window:half]:   # cut at line ends where one is near
            assert head.endswith(b"\n")
        assert len(data) <= cap + 64


def test_log_under_the_cap_and_uncapped_log_are_the_output_itself(tmp_path):
    output = b"".join(b"line %d\n" % i for i in range(20000))
    for cap in (None, 0, len(output), len(output) + 1):
        path = tmp_path / f"{cap}.log"
        log = RunLog(path, cap)
        log.write(output)
        log.close()
        assert path.read_bytes() == output and log.cut_bytes == 0


def test_capped_trial_keeps_the_metric_line_and_notes_the_cut(tmp_path):
    cap = 2**20
    outcome = run_process(spec_for(tmp_path, "flood.py", log_cap_bytes=cap))
    assert outcome.exit_code == 0 and outcome.metric == 1.75 and classify(outcome).kind == "ok"
    data = outcome.log_path.read_bytes()
    assert len(data) <= cap + 200
    found = MARKER.search(data)
    assert found and int(found.group(1)) == outcome.log_cut_bytes > 199 * 2**20
    assert int(found.group(2)) > 199 * 1024  # 1 KiB lines
    assert data.endswith(b"val_bpb: 1.75\n")
    assert pieces_of(outcome.log_path) == []


def test_kill_9_mid_trial_leaves_a_bounded_log_that_recovery_completes(tmp_path):
    """The orchestrator dies while a capped trial prints: the log is the head (half the cap)
    and at most two spill pieces; finish_log (called by recovery) puts it together."""
    cap = 2**20
    log_path = tmp_path / "runs" / "1-1.log"
    driver = (f"from pathlib import Path; import sys; from autoloop.execution.runner import RunSpec, run_process; "
              f"run_process(RunSpec(command=[sys.executable, {str(SCRIPTS / 'slow_flood.py')!r}], "
              f"cwd={str(tmp_path)!r}, log_path=Path({str(log_path)!r}), log_cap_bytes={cap}))")
    orchestrator = subprocess.Popen([sys.executable, "-c", driver])
    trials: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while not log_path.with_name(f"1-1.log{PIECE_INFIX}3").exists():  # the tail has rotated twice
            assert time.monotonic() < deadline and orchestrator.poll() is None, "no rotation seen"
            time.sleep(0.05)
        trials = psutil.Process(orchestrator.pid).children()
        orchestrator.kill()
        orchestrator.wait()
        psutil.wait_procs(trials, timeout=30)  # the trial's next write breaks the pipe
    finally:
        orchestrator.kill()
        for trial in trials:
            with contextlib.suppress(psutil.Error):
                trial.kill()
    pieces = pieces_of(log_path)
    assert 1 <= len(pieces) <= 2
    assert log_path.stat().st_size <= cap // 2 + 200           # the head and the note saying where the rest is
    assert sum(p.stat().st_size for p in pieces) <= cap - cap // 2 + cap - cap // 2
    assert b"[autoloop] output past the first" in log_path.read_bytes()[-300:]

    cut, lines = finish_log(log_path)
    data = log_path.read_bytes()
    assert pieces_of(log_path) == [] and cut > 0 and lines is None
    assert len(data) <= cap + 200
    found = MARKER.search(data)
    assert found and int(found.group(1)) == cut and found.group(2) is None
    numbers = [int(line.split()[1]) for line in data.splitlines() if line.startswith(b"line ")]
    assert numbers[0] == 0
    gap = numbers.index(next(b for a, b in itertools.pairwise(numbers) if b != a + 1))
    assert numbers[gap:] == list(range(numbers[gap], numbers[-1] + 1))  # the tail: consecutive lines
    assert finish_log(log_path) == (0, None) and log_path.read_bytes() == data  # a second call changes nothing


# ---------------------------------------------------------------------------------
# Loop level: flood, log cap in the ledger, kill -9 then --resume, free disk.

FLOOD_TRAIN = (SCRIPTS / "flood.py").read_text()
QUIET_OR_FLOOD_TRAIN = """\
import os, sys, time
if os.environ.get("AUTOLOOP_TEST_FLOOD"):
    exec(open(os.environ["AUTOLOOP_TEST_FLOOD"]).read())
print("---")
print("val_bpb: 1.5")
"""


def test_flooding_trial_is_judged_normally_with_a_capped_log(tmp_path, tiny_data_dir):
    repo = foreign_repo(tmp_path, FLOOD_TRAIN)
    proc = autoloop(repo, *foreign_run_args("--log-cap-mb", "1"), data_dir=tiny_data_dir)
    assert proc.returncode == 0 and "no more ideas" in proc.stdout, proc.stdout + proc.stderr
    [record] = assert_invariants(repo)
    assert record["status"] == "keep" and record["metric"] == 1.75
    log = (repo / "results" / record["log_path"]).read_bytes()
    assert len(log) <= 2**20 + 200
    found = MARKER.search(log)
    assert found and int(found.group(1)) == record["extra"]["log_cut_bytes"] > 199 * 2**20
    assert log.splitlines()[-1] == b"val_bpb: 1.75"
    assert pieces_of(repo / "results" / record["log_path"]) == []


def test_orchestrator_killed_mid_flood_then_resume_completes_the_log(tmp_path, tiny_data_dir):
    repo = foreign_repo(tmp_path, QUIET_OR_FLOOD_TRAIN)
    log_path = repo / "results" / "runs" / "0-1.log"  # the baseline is trial 0
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(tiny_data_dir), "AUTOLOOP_DEVICE": "cpu",
           "AUTOLOOP_TEST_FLOOD": str(SCRIPTS / "slow_flood.py")}
    cmd = [sys.executable, "-m", "autoloop.cli", *foreign_run_args("--log-cap-mb", "1", "--noise-runs", "0")]
    orchestrator = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not log_path.with_name(f"0-1.log{PIECE_INFIX}3").exists():
            assert time.monotonic() < deadline and orchestrator.poll() is None, "the flood never rotated"
            time.sleep(0.05)
        orchestrator.send_signal(signal.SIGKILL)
        orchestrator.wait()
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
    assert log_path.stat().st_size <= 2**19 + 200 and 1 <= len(pieces_of(log_path)) <= 2

    resumed = autoloop(repo, *foreign_run_args("--log-cap-mb", "1", "--resume"), data_dir=tiny_data_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    ledger = assert_invariants(repo)
    assert [(r["status"], r["reason"].split(" (")[0]) for r in ledger[:1]] == [("crash", "interrupted")]
    assert ledger[-1]["status"] == "keep" and ledger[-1]["metric"] == 1.5
    data = log_path.read_bytes()
    assert pieces_of(log_path) == [] and len(data) <= 2**20 + 200 and MARKER.search(data)


def test_low_disk_reason_checks_each_filesystem_once(tmp_path):
    assert low_disk_reason([tmp_path, tmp_path / "not" / "made" / "yet", None], 0) is None
    assert low_disk_reason([tmp_path, tmp_path / "not" / "made" / "yet"], 0.001) is None
    reason = low_disk_reason([tmp_path / "not" / "made" / "yet", tmp_path], 10**9)
    free = shutil.disk_usage(tmp_path).free / 2**30
    assert reason == f"low disk: {free:.1f} GB free on {tmp_path} (--min-free-gb 1e+09)"


def test_low_disk_stops_the_loop_cleanly(tmp_path, tiny_data_dir):
    repo = foreign_repo(tmp_path, QUIET_OR_FLOOD_TRAIN)
    autoloop(repo, *foreign_run_args(), data_dir=tiny_data_dir, check=True)
    before = ((repo / "results" / "ledger.jsonl").read_text(), read_tsv(repo))

    proc = autoloop(repo, *foreign_run_args("--resume", "--min-free-gb", "100000"), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stop = re.search(r"stopped: (low disk: [\d.]+ GB free on (\S+) \(--min-free-gb 100000\))", proc.stdout)
    assert stop and Path(stop.group(2)).exists(), proc.stdout
    state = json.loads((repo / "results" / "state.json").read_text())
    assert state["phase"] == "stopped" and state["stop_reason"] == stop.group(1)
    assert ((repo / "results" / "ledger.jsonl").read_text(), read_tsv(repo)) == before
    assert_invariants(repo)

    fresh = foreign_repo(tmp_path / "fresh", QUIET_OR_FLOOD_TRAIN)  # before the baseline, nothing runs
    proc = autoloop(fresh, *foreign_run_args("--min-free-gb", "100000"), data_dir=tiny_data_dir)
    assert proc.returncode == 0 and "stopped: low disk:" in proc.stdout, proc.stdout + proc.stderr
    assert not (fresh / "results" / "runs").exists() and git(fresh, "status", "--porcelain") == ""

    proc = autoloop(fresh, *foreign_run_args("--min-free-gb", "-1"), data_dir=tiny_data_dir)
    assert proc.returncode == 1 and proc.stderr.strip() == "autoloop: --min-free-gb: must be at least 0, got -1"


def test_low_disk_is_checked_before_every_trial(tmp_path, tiny_data_dir):
    """Between trials too, not only at start (where the test above sees it): the
    scheduler's stop conditions, asked before each trial, include the free space."""
    from autoloop.config.loading import build_settings
    from autoloop.engine.opening import open_night
    from autoloop.engine.scheduler import Scheduler
    from autoloop.observe.console import Console
    from autoloop.proposers.choose import make_proposer

    repo = foreign_repo(tmp_path, QUIET_OR_FLOOD_TRAIN)
    reasons = []
    for min_free_gb in (0, 0.001, 100000):
        settings = build_settings({"proposer": "queue", "min_free_gb": min_free_gb, "data_dir": str(tiny_data_dir),
                                   "tag": f"t{len(reasons)}"})
        with open_night(settings, repo, Console()) as night:
            reasons.append(Scheduler(night, make_proposer(settings, repo)[0]).stop_reason())
        git(repo, "checkout", "-q", "main")
    assert reasons[:2] == [None, None] and reasons[2].startswith("low disk: ")


def test_log_cap_setting_is_validated(tmp_path, tiny_data_dir):
    repo = foreign_repo(tmp_path, QUIET_OR_FLOOD_TRAIN)
    proc = autoloop(repo, *foreign_run_args("--log-cap-mb", "0.01"), data_dir=tiny_data_dir)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "autoloop: --log-cap-mb: must be 0 (no cap) or at least 0.125, got 0.01"


# ---------------------------------------------------------------------------------
# --isolate

@pytest.fixture
def listener():
    """A TCP server on the host's 127.0.0.1 that a trial may or may not reach."""
    server = socket.create_server(("127.0.0.1", 0))
    server.listen(16)
    yield server.getsockname()[1]
    server.close()


_AVAILABLE, _WHY = isolate.isolation_available()
needs_isolation = pytest.mark.skipif(not _AVAILABLE, reason=f"no network namespaces here: {_WHY}")


@needs_isolation
def test_isolated_trial_cannot_reach_the_host_network(tmp_path, listener):
    open_outcome = run_process(spec_for(tmp_path, "connect_out.py", str(listener)))
    assert open_outcome.metric == 2.0, open_outcome.log_tail
    isolated = run_process(spec_for(tmp_path, "connect_out.py", str(listener), isolate=True))
    assert isolated.exit_code == 0 and isolated.metric == 1.0, isolated.log_tail
    assert "could not connect: [Errno 111] Connection refused" in isolated.log_tail  # lo is up, nobody listens
    assert f"net namespace: {os.readlink('/proc/self/ns/net')}" in open_outcome.log_tail
    assert f"net namespace: {os.readlink('/proc/self/ns/net')}" not in isolated.log_tail
    assert f"user namespace: {os.readlink('/proc/self/ns/user')}" in isolated.log_tail  # root needs no user namespace


@needs_isolation
def test_unprivileged_fallback_through_a_user_namespace(tmp_path, listener, monkeypatch):
    real = isolate._unshare

    def no_privilege(flags):   # as for a normal user: a bare network namespace is refused
        return errno.EPERM if flags == isolate.CLONE_NEWNET else real(flags)

    monkeypatch.setattr(isolate, "_unshare", no_privilege)  # the forked child inherits it
    assert isolate.isolation_available() == (True, "")
    probe = tmp_path / "owner-probe.txt"
    outcome = run_process(spec_for(tmp_path, "connect_out.py", str(listener), str(probe), isolate=True))
    assert outcome.metric == 1.0, outcome.log_tail
    assert f"user namespace: {os.readlink('/proc/self/ns/user')}" not in outcome.log_tail  # it took the fallback
    assert f"net namespace: {os.readlink('/proc/self/ns/net')}" not in outcome.log_tail
    assert probe.stat().st_uid == os.getuid() and probe.stat().st_gid == os.getgid()  # ids map onto themselves


def test_isolation_unavailable_is_one_line_before_anything_runs(tmp_path, tiny_data_dir, monkeypatch, capsys):
    monkeypatch.setattr(isolate, "_unshare", lambda flags: errno.EPERM)
    ok, why = isolate.isolation_available()
    assert not ok and why.startswith("no permission to create a network namespace")

    outcome = run_process(spec_for(tmp_path, "connect_out.py", "1", isolate=True))  # no probe first
    assert outcome.exit_code == 126 and outcome.launch_error.startswith("--isolate: cannot enter a network namespace")
    assert classify(outcome).kind == "fundamental"

    from autoloop.cli.main import main

    repo = foreign_repo(tmp_path, QUIET_OR_FLOOD_TRAIN)
    monkeypatch.setenv("AUTOLOOP_DATA_DIR", str(tiny_data_dir))
    capsys.readouterr()
    assert main([*foreign_run_args("--isolate", "--noise-runs", "0"), "-C", str(repo)]) == 1
    err = capsys.readouterr().err
    assert err == (f"autoloop: --isolate: network namespaces are not available here ({why}); "
                   "run without --isolate\n")
    assert not (repo / "results" / "ledger.jsonl").exists() and not (repo / "results" / "runs").exists()


@needs_isolation
def test_isolate_flag_end_to_end(tmp_path, tiny_data_dir, listener):
    train = (SCRIPTS / "connect_out.py").read_text()
    metrics = {}
    for flag in ("", "--isolate"):
        repo = foreign_repo(tmp_path / (flag or "open"), train)
        proc = autoloop(repo, *foreign_run_args(*filter(None, [flag])), data_dir=tiny_data_dir,
                        env={"AUTOLOOP_TEST_PORT": str(listener)})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        [record] = assert_invariants(repo)
        metrics[flag] = record["metric"]
    assert metrics == {"": 2.0, "--isolate": 1.0}
