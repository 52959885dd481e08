"""The fixed metric: validation bits per byte, and the result record the harness trusts.

``evaluate_bpb`` is the one number every trial is judged by, so it lives in the harness
where a proposer cannot change it. It scores every byte of the pinned validation slice
(except the very first, which has nothing to condition on) with a fixed context length,
in eval mode, without gradients, in float64 accumulation so that the result does not
depend on the batch size beyond float rounding.

Model contract (also in train.py and program.md): ``model(x, y, reduction="none")``
takes int64 byte tensors of shape (B, T) with T <= EVAL_CONTEXT and returns the
per-byte cross-entropy in nats, shape (B, T) or (B*T,).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from autoloop.data import Dataset, load_data

# Every trial is scored with windows of this many bytes, whatever it trained with, so
# that numbers stay comparable across changes to train.py.
EVAL_CONTEXT = 512
DEFAULT_EVAL_BATCH = 32


def _is_oom(exc: BaseException) -> bool:
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None)) if t)
    return isinstance(exc, oom_types) or (isinstance(exc, RuntimeError) and "out of memory" in str(exc))


def _windows(n_bytes: int, context: int) -> list[tuple[int, int]]:
    """(start, length) of consecutive non-overlapping windows covering targets 1..n-1."""
    out, start = [], 0
    while start < n_bytes - 1:
        length = min(context, n_bytes - 1 - start)
        out.append((start, length))
        start += length
    return out


def _score(model: torch.nn.Module, data: np.ndarray, windows: list[tuple[int, int]], device: torch.device,
           batch_size: int) -> tuple[float, int]:
    """Sum of losses in nats over ``windows`` and the number of bytes scored."""
    total, count = 0.0, 0
    # bf16 where the GPU has bf16 tensor cores (sm80 on); below (T4, V100) it runs emulated: fp16,
    # as train.py trains there (the loss is taken in fp32 from soft-capped logits either way).
    if device.type == "cuda":
        sm80 = torch.cuda.get_device_capability(device)[0] >= 8
        autocast = torch.autocast("cuda", dtype=torch.bfloat16 if sm80 else torch.float16)
    else:
        autocast = torch.autocast("cpu", enabled=False)
    i = 0
    while i < len(windows):
        # Full windows batch together; a shorter final window goes alone.
        length = windows[i][1]
        group = [w for w in windows[i : i + batch_size] if w[1] == length]
        starts = torch.tensor([s for s, _ in group], dtype=torch.long)
        idx = starts[:, None] + torch.arange(length + 1)
        window = torch.from_numpy(data[idx.numpy()].astype("int64")).to(device)
        x, y = window[:, :-1], window[:, 1:]
        with autocast:
            loss = model(x, y, reduction="none")
        loss = loss.float().reshape(len(group), length)
        total += loss.double().sum().item()
        count += loss.numel()
        i += len(group)
    return total, count


def _bpb(model: torch.nn.Module, data: np.ndarray, context: int, batch_size: int,
         device: torch.device) -> tuple[float, int, int]:
    """(bits per byte, bytes scored, batch size that fit) over ``data``; an out-of-memory
    error restarts with half the batch (same number, just slower) until a batch of one fails."""
    windows = _windows(len(data), context)
    while True:
        try:
            total, count = _score(model, data, windows, device, batch_size)
            return total / count / math.log(2), count, batch_size
        except Exception as exc:  # only OOM is retried, the rest re-raised
            if not _is_oom(exc) or batch_size == 1:
                raise
            batch_size //= 2
            print(f"evaluation ran out of memory; retrying with batch size {batch_size}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()


@torch.no_grad()
def evaluate_bpb(model: torch.nn.Module, batch_size: int = DEFAULT_EVAL_BATCH, dataset: Dataset | None = None,
                 context: int = EVAL_CONTEXT, write_result: bool = True) -> float:
    """Mean cross-entropy in bits over the pinned validation bytes.

    Out of memory is not a reason to lose a trained model: the evaluation restarts with
    half the batch (same number, just slower) until a batch of one fails too.
    When ``$AUTOLOOP_RESULT`` is set the result record is written there as JSON, with
    ``audit_bpb``: the same measure on the held-out audit slice (128 KiB by default, so
    a fraction of the validation pass). The harness records it but never decides on it
    or shows it to a proposer: it tells, in the morning, whether the night over-fitted
    the validation slice. The return value is val_bpb only.
    """
    dataset = dataset or load_data()
    data = dataset.split("val")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    audit = None
    try:
        bpb, count, batch_size = _bpb(model, data, context, batch_size, device)
        seconds = time.perf_counter() - t0
        # AUTOLOOP_AUDIT=0: the harness will never read this run's audit figure (a scout
        # run, --scout): the audit pass, a quarter of the evaluation, is not paid for.
        if write_result and os.environ.get("AUTOLOOP_RESULT") and os.environ.get("AUTOLOOP_AUDIT") != "0":
            try:
                audit_data = dataset.split("audit")
            except Exception:  # an older prepared dataset without audit bytes
                audit_data = None
            if audit_data is not None and len(audit_data) > 1:
                audit = _bpb(model, audit_data, context, batch_size, device)[0]
    finally:
        model.train(was_training)
    if write_result:
        write_result_file(bpb, count, dataset.fingerprint, seconds, context, audit_bpb=audit)
    return bpb


def write_result_file(bpb: float, eval_bytes: int, fingerprint: str, eval_seconds: float,
                      context: int = EVAL_CONTEXT, audit_bpb: float | None = None) -> Path | None:
    """Write the result record to ``$AUTOLOOP_RESULT`` atomically; nothing when unset."""
    target = os.environ.get("AUTOLOOP_RESULT")
    if not target:
        return None
    record = {
        "metric": "val_bpb",
        "value": bpb,
        "val_bpb": bpb,
        "eval_bytes": eval_bytes,
        "eval_context": context,
        "fingerprint": fingerprint,
        "eval_seconds": round(eval_seconds, 3),
        "nonce": os.environ.get("AUTOLOOP_NONCE"),
        "written_at": time.time(),
    }
    if audit_bpb is not None:
        record["audit_bpb"] = audit_bpb
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, path)
    return path
