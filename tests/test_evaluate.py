"""The fixed metric: exact bytes scored, determinism, the OOM retry and the result record."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autoloop.data import Dataset
from autoloop.evaluate import EVAL_CONTEXT, _windows, evaluate_bpb


class Bigram(nn.Module):
    """A tiny real model honouring the contract: per-byte losses in nats."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.table = nn.Embedding(256, 256)
        self.calls: list[int] = []

    def forward(self, x, y, reduction="mean"):
        self.calls.append(x.size(0))
        logits = self.table(x)
        return F.cross_entropy(logits.view(-1, 256), y.reshape(-1), reduction=reduction)


class Uniform(nn.Module):
    def __init__(self):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, x, y, reduction="mean"):
        return torch.full(y.shape, math.log(256.0))


class OomAboveBatch(Bigram):
    """Raises a real torch OutOfMemoryError for batches larger than ``limit``."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def forward(self, x, y, reduction="mean"):
        if x.size(0) > self.limit:
            self.calls.append(-x.size(0))
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {x.size(0)} GiB")
        return super().forward(x, y, reduction)


def test_windows_cover_every_target_exactly_once():
    for n in (2, 3, EVAL_CONTEXT, EVAL_CONTEXT + 1, 5 * EVAL_CONTEXT + 17):
        wins = _windows(n, EVAL_CONTEXT)
        covered = [s + 1 + i for s, length in wins for i in range(length)]
        assert covered == list(range(1, n))


def test_uniform_model_scores_exactly_eight_bits(tiny_data_dir):
    bpb = evaluate_bpb(Uniform(), dataset=Dataset(tiny_data_dir), write_result=False)
    assert bpb == pytest.approx(8.0, abs=1e-6)  # float32 losses


def test_evaluation_is_deterministic_and_batch_independent(tiny_data_dir):
    ds = Dataset(tiny_data_dir)
    model = Bigram()
    a = evaluate_bpb(model, dataset=ds, write_result=False)
    b = evaluate_bpb(model, dataset=ds, write_result=False)
    c = evaluate_bpb(model, batch_size=3, dataset=ds, write_result=False)
    assert a == b
    assert c == pytest.approx(a, rel=1e-6)
    assert model.training  # the model's mode is restored


def test_out_of_memory_retries_with_half_the_batch(tiny_data_dir, capsys):
    ds = Dataset(tiny_data_dir)
    reference = evaluate_bpb(Bigram(), dataset=ds, write_result=False)
    model = OomAboveBatch(limit=8)
    value = evaluate_bpb(model, batch_size=32, dataset=ds, write_result=False)
    assert value == pytest.approx(reference, rel=1e-6)
    # 16 KiB of validation = 31 full windows + one short one, so the first batch holds 31.
    assert [-31, -16] == [c for c in model.calls if c < 0]
    assert "retrying with batch size 8" in capsys.readouterr().out


def test_out_of_memory_at_batch_one_is_raised(tiny_data_dir):
    with pytest.raises(torch.OutOfMemoryError):
        evaluate_bpb(OomAboveBatch(limit=0), batch_size=4, dataset=Dataset(tiny_data_dir), write_result=False)


def test_result_record_is_written_when_asked(tiny_data_dir, tmp_path, monkeypatch):
    target = tmp_path / "out" / "result.json"
    monkeypatch.setenv("AUTOLOOP_RESULT", str(target))
    monkeypatch.setenv("AUTOLOOP_NONCE", "n0nce")
    ds = Dataset(tiny_data_dir)
    value = evaluate_bpb(Bigram(), dataset=ds)
    record = json.loads(target.read_text())
    assert record["val_bpb"] == value and record["metric"] == "val_bpb"
    assert record["eval_bytes"] == len(ds.split("val")) - 1
    assert record["fingerprint"] == ds.fingerprint
    assert record["nonce"] == "n0nce" and record["eval_seconds"] >= 0
    assert not list(target.parent.glob("*.tmp"))
