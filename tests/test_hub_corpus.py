"""A named public corpus (``--corpus climbmix``) prepared from a local stand-in of the Hugging
Face hub (tests/helpers/hub.py, reached through HF_ENDPOINT: nothing leaves the machine).

The corpus is made here, 144 MiB of text in four parquet shards, never committed. Its
download is killed in the middle of a shard and resumed; the fingerprint is the same after
a rebuild; the preparing process's peak memory is measured (os.wait4) and stays far below
the corpus; and the real train.py trains on it through a memory map (seen in /proc/PID/maps)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.git import TRAIN_PY
from helpers.hub import HubStandIn

pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")
pytest.importorskip("huggingface_hub")
np = pytest.importorskip("numpy")

REPO = Path(__file__).resolve().parents[1]
SHARDS = 4
SHARD_TEXT_BYTES = 36 * 2**20    # four of them: 144 MiB of text
# The third shard's first download stops here: huggingface_hub's http_get writes what it receives in
# chunks of 10 MiB (constants.DOWNLOAD_CHUNK_SIZE), so two whole chunks reach the disk.
CHUNK = 10 * 2**20
STALL_AFTER = 2 * CHUNK + 2**20
# What the preparing process may hold beyond its imports: pyarrow's pages and batches, a
# unit, buffers (measured: 70-80 MB over the imports on this corpus, about 50 of them
# pyarrow's alone; the same shards read one at a time took 34). The training split, about
# 125 MiB, is more: a process holding it whole would not pass.
MEMORY_OVER_IMPORTS_MB = 100


def make_shards(folder: Path) -> int:
    """Four parquet shards of distinct documents (random words; a document number keeps every
    one different), written a batch at a time; returns the bytes of text in them."""
    rng = np.random.default_rng(0)
    words = np.array(["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=n))
                      for n in rng.integers(2, 10, size=4000)])
    block = " ".join(words[rng.integers(0, len(words), size=600_000)])   # ~3.5 MB of text to cut documents from
    total = 0
    folder.mkdir(parents=True)
    for shard in range(SHARDS):
        docs, size = [], 0
        while size < SHARD_TEXT_BYTES:
            start, length = int(rng.integers(0, len(block) - 20_000)), int(rng.integers(500, 20_000))
            doc = f"document {shard}-{len(docs)}: {block[start:start + length]}"
            docs.append(doc)
            size += len(doc)
        pq.write_table(pa.table({"id": list(range(len(docs))), "text": docs}),
                       folder / f"shard_{shard:05d}.parquet", row_group_size=512, compression="NONE")
        total += size
    return total


def hub_env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf-home"),
            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "XDG_CACHE_HOME": str(tmp_path / "cache")}


def prepare_args(data_dir: Path) -> list[str]:
    # Small validation and audit slices: train.py's evaluation then takes a second, as in the other tests.
    return [sys.executable, "-m", "autoloop.cli", "prepare", "--corpus", "climbmix", "--shards", str(SHARDS),
            "--data-dir", str(data_dir), "--val-bytes", "16384", "--audit-bytes", "4096"]


def written(shards_dir: Path) -> int:
    """The bytes of the partial download (a shard's .part file)."""
    partial = list(shards_dir.glob("*.part"))
    try:
        return partial[0].stat().st_size if partial else 0
    except FileNotFoundError:
        return 0


# Runs the CLI and, as it exits, writes the peak resident memory of its own address space
# (VmHWM: since its exec, unlike ru_maxrss, which a child inherits from the forking parent).
MEASURED = """\
import atexit, sys
out = sys.argv[1]
def peak():
    line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    open(out, "w").write(str(int(line.split()[1]) / 1024))
atexit.register(peak)
if sys.argv[2] == "--imports-only":
    import autoloop.cli.main, autoloop.data, huggingface_hub, pyarrow.parquet
else:
    from autoloop.cli.main import main
    sys.argv[1:] = sys.argv[2:]
    sys.exit(main())
"""


def run_measured(args: list[str], env: dict[str, str], tmp_path: Path) -> tuple[int, str, float]:
    """(exit code, output, peak resident MB) of the CLI run with ``args``."""
    peak = tmp_path / f"peak-{time.monotonic_ns()}.txt"
    proc = subprocess.run([sys.executable, "-c", MEASURED, str(peak), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr, float(peak.read_text())


@pytest.mark.xdist_group("real_training")
def test_a_named_corpus_is_fetched_resumed_pinned_and_read_by_memory_map(tmp_path):
    served = tmp_path / "hub"
    text_bytes = make_shards(served)
    assert text_bytes >= 100 * 10**6
    hub = HubStandIn(served, stall_file="shard_00002.parquet", stall_after=STALL_AFTER)
    endpoint, server = hub.start()
    env = hub_env(tmp_path, endpoint)
    data_dir = tmp_path / "data"
    shards_dir = tmp_path / "cache" / "autoloop" / "hub" / "climbmix"
    try:
        # 1. Killed in the middle of the third shard.
        first = subprocess.Popen(prepare_args(data_dir), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            # Killed once the two chunks are on disk (the third never comes): mid-file for certain.
            while first.poll() is None and not (hub.stalled.is_set() and written(shards_dir) >= 2 * CHUNK):
                time.sleep(0.05)
        finally:
            first.send_signal(signal.SIGKILL)
            early = first.communicate(timeout=60)[0].decode(errors="replace")
        assert hub.stalled.is_set() and written(shards_dir) == 2 * CHUNK, early
        hub.release.set()
        pinned = (shards_dir / "pinned.json").read_text()
        assert "shard_00000.parquet" in pinned and "shard_00001.parquet" in pinned
        assert "shard_00002.parquet" not in pinned and not data_dir.exists()
        done_before = len(hub.requests)

        # 2. Resumed: the finished shards are not fetched again, the partial one continues.
        code, output, peak_mb = run_measured(prepare_args(data_dir)[3:], env, tmp_path)
        assert code == 0, output
        again = hub.requests[done_before:]
        assert not [r for r in again if r.path in ("shard_00000.parquet", "shard_00001.parquet")], again
        resumed = [r for r in again if r.method == "GET" and r.path == "shard_00002.parquet"]
        assert len(resumed) == 1 and resumed[0].range_start == 2 * CHUNK, again
        for name in (f"shard_{i:05d}.parquet" for i in range(SHARDS)):   # every shard's bytes are the hub's
            assert hub.sha256(name) in (shards_dir / "pinned.json").read_text()
        fingerprint = re.search(r"^fingerprint: (\w+)$", output, re.M)[1]
        assert re.search(r"^built: ", output, re.M), output

        # 3. The memory of the preparing process is bounded: a batch of rows, not the corpus.
        baseline_mb = run_measured(["--imports-only"], env, tmp_path)[2]
        train_mb = (data_dir / "train.bin").stat().st_size / 2**20
        assert train_mb > MEMORY_OVER_IMPORTS_MB + 20
        print(f"prepare's peak {peak_mb:.0f} MB, its imports alone {baseline_mb:.0f} MB, train.bin {train_mb:.0f} MiB")
        assert peak_mb < baseline_mb + MEMORY_OVER_IMPORTS_MB, (peak_mb, baseline_mb, train_mb)

        # 4. Pinned: again is "already prepared" without a request; rebuilt from the kept
        # shards it has the same fingerprint.
        asked = len(hub.requests)
        again_run = subprocess.run(prepare_args(data_dir), env=env, capture_output=True, text=True, timeout=300)
        assert again_run.returncode == 0 and "already prepared" in again_run.stdout, again_run.stdout
        assert f"fingerprint: {fingerprint}" in again_run.stdout and len(hub.requests) == asked
        rebuilt = subprocess.run(prepare_args(tmp_path / "data2"), env=env, capture_output=True, text=True,
                                 timeout=300)
        assert rebuilt.returncode == 0 and f"fingerprint: {fingerprint}" in rebuilt.stdout, rebuilt.stdout
        assert len(hub.requests) == asked
    finally:
        hub.release.set()
        server.shutdown()

    # 5. train.py reads it through a memory map, never whole.
    train_env = {**env, "AUTOLOOP_DATA_DIR": str(data_dir), "AUTOLOOP_DEVICE": "cpu", "AUTOLOOP_BUDGET_S": "1",
                 "AUTOLOOP_RESULT": str(tmp_path / "result.json")}
    proc = subprocess.Popen([sys.executable, str(TRAIN_PY)], cwd=tmp_path, env=train_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    mapped = False
    while proc.poll() is None and not mapped:
        try:
            mapped = str(data_dir / "train.bin") in Path(f"/proc/{proc.pid}/maps").read_text()
        except OSError:
            break
        time.sleep(0.05)
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout
    assert mapped, "train.bin was never memory-mapped by train.py"
    assert f"data: {fingerprint}" in stdout


def test_a_named_corpus_without_the_hub_extra_is_one_line(tmp_path):
    blocker = tmp_path / "blocker" / "huggingface_hub"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'blocker'}{os.pathsep}{REPO}", "XDG_CACHE_HOME": str(tmp_path)}
    proc = subprocess.run(prepare_args(tmp_path / "data"), env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "autoloop: a named corpus needs huggingface_hub and pyarrow: pip install 'autoloop[hub]'"], proc.stderr
