"""The real train.py, run as a process on CPU with a budget of a few seconds."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.git import TRAIN_PY

# autoresearch's fields in its order, then the matmul weights (the ladder's N) and the ranks' throughput.
SUMMARY_FIELDS = ["val_bpb", "training_seconds", "total_seconds", "peak_vram_mb", "mfu_percent",
                  "total_tokens_M", "num_steps", "num_params_M", "depth", "matmul_params_M", "tokens_per_sec",
                  "world_size", "micro_batch", "accum_steps", "epochs"]


def run_train(script: Path, env: dict, tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    import os

    full_env = {**os.environ, **env, "AUTOLOOP_RESULT": str(tmp_path / "result.json")}
    return subprocess.run([sys.executable, str(script)], cwd=script.parent, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def parse_summary(stdout: str) -> dict[str, float | str]:
    """The summary block; a value that is no number stays text."""
    lines = stdout.strip().splitlines()
    block = lines[len(lines) - 1 - lines[::-1].index("---") + 1:]
    pairs = (re.match(r"^(\w+):\s+(\S.*)$", line).groups() for line in block)
    return {k: float(v) if re.fullmatch(r"[-\d.]+", v) else v for k, v in pairs}


def test_train_py_runs_within_budget_and_reports(trial_env, tmp_path):
    proc = run_train(TRAIN_PY, trial_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = parse_summary(proc.stdout)
    assert list(summary) == SUMMARY_FIELDS  # names and order as autoresearch prints them
    result = json.loads((tmp_path / "result.json").read_text())
    assert abs(result["val_bpb"] - summary["val_bpb"]) < 5e-7
    assert 0 < summary["val_bpb"] < 8.0  # better than a uniform guess after 3 seconds
    budget = float(trial_env["AUTOLOOP_BUDGET_S"])
    # Training time is the sum of whole steps, so it passes the budget by about one step (on a
    # loaded machine one step may take far longer than the average: 3 s of slack for that).
    step_time = summary["training_seconds"] / max(summary["num_steps"] - 1, 1)
    assert budget <= summary["training_seconds"] <= budget + 2 * step_time + 3.0
    assert summary["total_seconds"] >= summary["training_seconds"]
    assert summary["num_steps"] > 1 and summary["peak_vram_mb"] > 0
    # A CPU has no bf16 peak: nan (float() reads it), and the log says why.
    assert math.isnan(float(summary["mfu_percent"])) and summary["world_size"] == 1
    assert "mfu_percent is nan: no dense bf16 peak is known for cpu" in proc.stdout
    assert summary["tokens_per_sec"] > 0
    # The passes over the training bytes: all tokens trained over the training split's size.
    meta = json.loads((Path(trial_env["AUTOLOOP_DATA_DIR"]) / "meta.json").read_text())
    train_bytes = meta["splits"]["train"]["bytes"]
    assert summary["epochs"] == pytest.approx(summary["total_tokens_M"] * 1e6 / train_bytes, abs=2e-3)
    assert 0 < summary["epochs"] < 1 and "WARNING" not in proc.stdout   # 3 s on a CPU read a sliver of 10 MB


def test_more_than_one_epoch_is_a_warning_in_the_run(tmp_path):
    """Ten steps of 2,048 bytes over a training split of about 13 KB: more than one epoch, said in
    the log with the command that fixes it, and the figure in the summary block."""
    from autoloop.data import CorpusSpec, prepare

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(300):   # small files, so that some land in the validation split
        (corpus / f"{i}.txt").write_text(f"file {i:03d}: the quick brown fox jumps over the dog\n")
    info = prepare(CorpusSpec(str(corpus), val_bytes=600, audit_bytes=0), tmp_path / "data")
    env = {"AUTOLOOP_DATA_DIR": str(tmp_path / "data"), "AUTOLOOP_DEVICE": "cpu", "AUTOLOOP_MAX_STEPS": "10"}
    proc = run_train(TRAIN_PY, env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    epochs = 10 * 2048 / info.meta["splits"]["train"]["bytes"]
    assert parse_summary(proc.stdout)["epochs"] == pytest.approx(epochs, abs=2e-3) and epochs > 1
    assert (f"WARNING: {epochs:.1f} epochs over the training bytes: val_bpb ranks memorisation, not learning; "
            "a larger corpus fixes it: autoloop prepare --corpus climbmix, then autoloop run --corpus climbmix"
            ) in proc.stdout.splitlines()


def test_out_of_memory_at_step_0_halves_the_micro_batch_and_keeps_the_batch(trial_env, tmp_path):
    """AUTOLOOP_FORCE_OOM_ABOVE=4 makes step 0 raise torch.OutOfMemoryError for micro-batches
    above 4 sequences, as a GPU short of memory would: the step is retried at 8, then at 4
    sequences with 4 accumulation steps, and the run trains the same global batch, step for
    step, as one without the failure (the same tokens; val_bpb apart only by float sums)."""
    env = {**trial_env, "AUTOLOOP_MAX_STEPS": "6", "AUTOLOOP_SIZES": "64,1,16,64"}   # a tiny model: seconds
    plain = run_train(TRAIN_PY, env, tmp_path)
    squeezed = run_train(TRAIN_PY, {**env, "AUTOLOOP_FORCE_OOM_ABOVE": "4"}, tmp_path)
    assert plain.returncode == 0 and squeezed.returncode == 0, squeezed.stdout + squeezed.stderr
    assert re.findall(r"^out of memory at step 0: micro-batch halved to (\d+) sequences per rank", squeezed.stdout,
                      re.M) == ["8", "4"], squeezed.stdout
    assert "memory: micro-batch 4 sequences per rank, 4 accumulation steps per step of 16" in squeezed.stdout
    a, b = parse_summary(plain.stdout), parse_summary(squeezed.stdout)
    assert (a["micro_batch"], a["accum_steps"], b["micro_batch"], b["accum_steps"]) == (16, 1, 4, 4)
    assert a["total_tokens_M"] == b["total_tokens_M"] and a["num_steps"] == b["num_steps"] == 6
    assert abs(a["val_bpb"] - b["val_bpb"]) < 1e-3, (a["val_bpb"], b["val_bpb"])


def test_nan_loss_fails_fast(trial_env, tmp_path):
    broken = tmp_path / "train.py"
    source = TRAIN_PY.read_text()
    assert "MATRIX_LR = " in source
    broken.write_text(re.sub(r"^MATRIX_LR = [^#\n]*", "MATRIX_LR = float('nan') ", source, count=1, flags=re.M))
    proc = run_train(broken, {**trial_env, "AUTOLOOP_BUDGET_S": "30"}, tmp_path)
    assert proc.returncode != 0
    assert re.search(r"^FAIL: loss is nan at step \d+$", proc.stdout, re.M), proc.stdout
    assert not (tmp_path / "result.json").exists()


# ------------------------------------------------------------------------------ device profiles
# No GPU here: the profile choice, the MFU accounting and the shapes a GPU would train are
# checked on the CPU, and the scaled-up code path runs for real on the CPU through
# AUTOLOOP_PROFILE.


def load_train_module(monkeypatch):
    """train.py imported as a module (nothing runs: main() is behind __name__)."""
    import importlib.util

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # what train.py would set; restored afterwards
    spec = importlib.util.spec_from_file_location("train_under_test", TRAIN_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_profile_follows_the_device_and_scales_the_constants(monkeypatch):
    train = load_train_module(monkeypatch)
    monkeypatch.delenv("AUTOLOOP_PROFILE", raising=False)
    cpu = train.resolve_profile("cpu")
    assert (cpu["width"], cpu["depth"], cpu["batch"], cpu["seq_len"]) == (
        train.WIDTH, train.DEPTH, train.BATCH_SIZE, train.SEQ_LEN)
    assert not cpu["bf16"] and not cpu["compile"] and cpu["lr_scale"] == 1.0
    assert cpu["sparse_bigram"]    # SparseAdam on the rows a CPU step touched

    h100 = train.resolve_profile("cuda", gpu_memory_gib=79.2)
    factors = train.PROFILES["cuda"]
    assert h100["width"] == train.WIDTH * factors["width"] and h100["depth"] == train.DEPTH * factors["depth"]
    assert h100["batch"] == train.BATCH_SIZE * factors["batch"]
    assert h100["seq_len"] == min(train.SEQ_LEN * factors["seq"], 512)
    assert h100["bf16"] and h100["compile"] and h100["lr_scale"] < 1 and not h100["sparse_bigram"]
    assert h100["width"] % train.HEAD_DIM == 0
    assert train.resolve_profile("cuda", gpu_memory_gib=141)["batch"] == h100["batch"]   # an H200 alike
    assert h100["memory_micro_batch"] == h100["batch"]   # one micro-batch: no accumulation
    # A smaller GPU keeps the model and the batch, and halves the micro-batch per halving of memory.
    small = train.resolve_profile("cuda", gpu_memory_gib=24)
    assert small["width"] == h100["width"] and small["batch"] == h100["batch"]
    assert small["memory_micro_batch"] == h100["batch"] // 4
    monkeypatch.setattr(train, "WORLD_SIZE", 8)   # one rank's slice, cut to what its memory holds
    assert train.micro_batch(h100) == h100["batch"] // 8 and train.micro_batch(small) == h100["batch"] // 8
    monkeypatch.setattr(train, "WORLD_SIZE", 2)
    assert train.micro_batch(small) == h100["batch"] // 4   # 64 rows per rank in two micro-batches of 32
    monkeypatch.setattr(train, "WORLD_SIZE", 1)

    mps = train.resolve_profile("mps")
    assert mps["name"] == "mps" and mps["width"] > cpu["width"] and not mps["compile"]

    monkeypatch.setenv("AUTOLOOP_PROFILE", "cpu")     # the CPU sizes on a GPU, by hand
    assert train.resolve_profile("cuda", gpu_memory_gib=80) == cpu


def test_unknown_profile_is_one_line_and_exit_1(monkeypatch, capsys):
    train = load_train_module(monkeypatch)
    monkeypatch.setenv("AUTOLOOP_PROFILE", "tpu")
    with pytest.raises(SystemExit) as e:
        train.resolve_profile("cpu")
    assert e.value.code == 1
    assert capsys.readouterr().out == "FAIL: AUTOLOOP_PROFILE=tpu is not one of cpu, cuda, mps\n"


def test_cuda_device_and_rank_group_set_up_as_a_gpu_would_be(monkeypatch):
    """No GPU here: torch's calls are recorded instead of made. A single-rank trial on cuda:1
    sets its device (else allocations and memory counters follow GPU 0) and reads its own
    GPU's reserved memory; ranks wait on each other at most half of what the hard timeout
    (AUTOLOOP_TIMEOUT_S, from the runner) leaves beyond the budget, and NCCL is given the device."""
    monkeypatch.setenv("AUTOLOOP_BUDGET_S", "300")
    monkeypatch.setenv("AUTOLOOP_TIMEOUT_S", "600")
    train = load_train_module(monkeypatch)
    assert train.HARD_TIMEOUT_S == 600 and train.COLLECTIVE_TIMEOUT_S == 150
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: calls.append(("reserved", d)) or 3 * 2**20)
    monkeypatch.setattr(train.dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    gpu1 = torch.device("cuda", 1)
    train.init_ranks(gpu1)
    assert train.peak_memory_mb(gpu1) == 3.0
    assert calls == [("set_device", gpu1), ("reserved", gpu1)]   # one rank: no process group
    calls.clear()
    monkeypatch.setattr(train, "WORLD_SIZE", 2)
    train.init_ranks(gpu1)
    assert calls[0] == ("set_device", gpu1) and calls[1][0] == "nccl"
    assert calls[1][1]["device_id"] == gpu1 and calls[1][1]["timeout"].total_seconds() == 150
    # Run by hand, with no limit passed: the harness's default rule for the budget.
    monkeypatch.delenv("AUTOLOOP_TIMEOUT_S")
    monkeypatch.setenv("AUTOLOOP_BUDGET_S", "60")
    assert load_train_module(monkeypatch).COLLECTIVE_TIMEOUT_S == 60   # (max(120, 60 + 120) - 60) / 2


def test_mfu_accounting(monkeypatch):
    train = load_train_module(monkeypatch)
    assert train.peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert train.peak_flops("NVIDIA H200") == 989.4e12
    assert train.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert train.peak_flops("NVIDIA A100-SXM4-40GB") == 312e12
    assert train.peak_flops("NVIDIA GeForce GTX 1080") is None   # no honest figure: MFU is not printed
    # The names torch gives the datasheets' parts, each to its own dense bf16 peak.
    assert train.peak_flops("NVIDIA H100 NVL") == 835e12 and train.peak_flops("NVIDIA H200 NVL") == 835e12
    assert train.peak_flops("NVIDIA B200") == 2250e12 and train.peak_flops("NVIDIA GH200 480GB") == 989.4e12
    assert train.peak_flops("NVIDIA A100 80GB PCIe") == 312e12 and train.peak_flops("NVIDIA L40S") == 362.05e12
    assert train.peak_flops("NVIDIA A10") == 125e12 and train.peak_flops("NVIDIA A10G") is None
    assert train.peak_flops("NVIDIA GeForce RTX 4090") == 165.2e12
    assert train.peak_flops("NVIDIA GeForce RTX 5090") == 209.5e12
    assert train.peak_flops("AMD Instinct MI300X") == 1307.4e12
    cfg = train.resolve_profile("cuda", gpu_memory_gib=80)
    with torch.device("meta"):     # the H100 model's shapes without its memory
        model = train.GPT(cfg)
    width, depth = cfg["width"], cfg["depth"]
    per_block = (3 + 1 + 2 * train.MLP_RATIO) * width * width
    gates = sum(width // train.HEAD_DIM * 32 for i in range(depth) if train.has_value_embed(i, depth))
    expected = 6 * (depth * per_block + gates + 256 * width) + 12 * depth * width * cfg["seq_len"]
    assert train.flops_per_token(model, cfg["seq_len"]) == expected
    assert 60e6 < depth * per_block < 120e6   # GPT-2-small class, as the profile's comment says


def test_attention_at_evaluation_keeps_to_the_training_window(monkeypatch):
    """Evaluation feeds 512 bytes; a position must not see further back than training taught it
    (the window plus the block's short causal mix and the bigram table's previous byte), so
    RoPE is never asked to extrapolate."""
    train = load_train_module(monkeypatch)
    torch.manual_seed(0)
    cfg = {**train.resolve_profile("cpu"), "depth": 1}   # one block: its reach fits in 512 bytes
    model = train.GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():     # no zero-initialised layer: every path carries signal
            p.add_(0.05 * torch.randn_like(p))
    reach = cfg["seq_len"] - 1 + train.CONV_TAPS - 1 + int(train.BIGRAM_EMBED)
    x = torch.randint(0, 256, (1, 512))
    changed = x.clone()
    changed[0, :40] = (x[0, :40] + 1) % 256
    with torch.no_grad():
        a, b = model(x)[0], model(changed)[0]
    assert reach + 40 < 512
    assert torch.allclose(a[reach + 40:], b[reach + 40:], rtol=0, atol=1e-6)   # out of reach: no influence
    assert (a[reach + 39] - b[reach + 39]).abs().max() > 1e-5   # the last position in reach of byte 39 feels it


def test_scaled_profile_trains_for_real_on_cpu(trial_env, tmp_path):
    """The code path of a scaled profile (sizes multiplied, a 512-byte context, so no window
    mask at evaluation, the bigram table's dense gradient), run for real on the CPU as
    AUTOLOOP_PROFILE=mps with the MPS factors cut to what 2 seconds on a CPU allow."""
    source = TRAIN_PY.read_text()
    line = re.search(r'^    "mps": dict\(.*\),$', source, re.M)
    assert line, "PROFILES has no mps entry"
    seq = 512 // int(re.search(r"^SEQ_LEN = (\d+)", source, re.M).group(1))   # to the 512-byte context
    script = tmp_path / "train.py"
    cut = f"width=1, depth=1, batch=1, seq={seq}, bf16=False, compile=False, sparse=False, fused=False"
    script.write_text(source.replace(line.group(0), f'    "mps": dict({cut}),'))
    proc = run_train(script, {**trial_env, "AUTOLOOP_PROFILE": "mps", "AUTOLOOP_BUDGET_S": "2"}, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"profile: mps \(\d+ x \d+, batch \d+ x 512\)", proc.stdout), proc.stdout
    summary = parse_summary(proc.stdout)
    assert list(summary) == SUMMARY_FIELDS and 0 < summary["val_bpb"] < 8.5


@pytest.mark.slow
def test_cuda_profile_code_paths_run_on_the_cpu(trial_env, tmp_path):
    """The cuda profile's switches (bf16 autocast, torch.compile, fused AdamW) for a few steps on
    the CPU at sizes cut through AUTOLOOP_SIZES, so that a Python-level error in the GPU path
    fails here, not on a user's first night. Compilation takes about a minute of CPU, cold."""
    script = tmp_path / "train.py"
    source = TRAIN_PY.read_text()
    try:
        torch.optim.AdamW([torch.zeros(1, requires_grad=True)], fused=True)
    except RuntimeError:   # torch < 2.4 has no fused AdamW on the CPU: only that switch is skipped
        import warnings

        warnings.warn("this torch has no fused AdamW on the CPU: the cuda profile runs unfused here", stacklevel=1)
        source = re.sub(r'^(    "cuda": dict\(.*)fused=True', r"\1fused=False", source, count=1, flags=re.M)
    script.write_text(source)
    env = {**trial_env, "AUTOLOOP_PROFILE": "cuda", "AUTOLOOP_SIZES": "64,1,4,64", "AUTOLOOP_MAX_STEPS": "12"}
    proc = run_train(script, env, tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "profile: cuda (1 x 64, batch 4 x 64, bf16, compiled)" in proc.stdout, proc.stdout
    summary = parse_summary(proc.stdout)
    assert summary["num_steps"] == 12 and 0 < summary["val_bpb"] < 8.5
