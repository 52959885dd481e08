"""A small byte-level GPT, trained for a fixed wall-clock budget, scored in val_bpb.

This is the ONE file a proposer edits. Everything about the model, the optimizer and
the training loop may change; the data, the evaluation and the harness may not (they
live in the `autoloop` package). Read it top to bottom: constants, model, optimizer,
loop, evaluation, summary.

Contract with the harness (see program.md):
  * the model answers ``model(x, y, reduction="none")`` with per-byte losses in nats and
    must accept sequences up to EVAL_CONTEXT bytes, because evaluation uses that length;
  * training stops after AUTOLOOP_BUDGET_S seconds of training (start-up, compilation
    and evaluation excluded), then ``evaluate_bpb`` produces the metric;
  * the summary block below is printed last; on NaN or exploding loss it prints FAIL
    and exits non-zero.

Runs by hand with nothing set: ``python train.py`` (5 minutes, stdlib corpus).
"""

import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from autoloop.data import load_data
from autoloop.evaluate import EVAL_CONTEXT, evaluate_bpb

# ---------------------------------------------------------------------------------
# Hyperparameters. Defaults are tuned for a 5-minute budget on 2 CPU cores (fp32);
# on a GPU, a wider and deeper model with a larger batch is the first thing to try.

DEPTH = 3               # transformer blocks
WIDTH = 128             # model dimension
N_HEADS = 4             # attention heads (head dim = WIDTH // N_HEADS)
MLP_RATIO = 4           # hidden width of the MLP relative to WIDTH
SEQ_LEN = 512           # training context in bytes; below EVAL_CONTEXT, RoPE must extrapolate at eval
BATCH_SIZE = 4          # sequences per step: small batches, many steps in a short budget
ROPE_BASE = 10000.0     # rotary position embedding base
LOGIT_SOFTCAP = 15.0    # tanh cap on the output logits: tames early spikes

MATRIX_LR = 0.02        # Muon learning rate for the 2-D weights inside the blocks
MUON_MOMENTUM = 0.9     # Muon (Nesterov) momentum
EMBED_LR = 0.3          # AdamW learning rate for the byte embedding
HEAD_LR = 0.01          # AdamW learning rate for the output head
ADAM_BETAS = (0.8, 0.95)
WEIGHT_DECAY = 0.0      # decoupled weight decay on the Muon matrices
GRAD_CLIP = 1.0         # global gradient-norm clip (0 disables)

WARMUP_FRAC = 0.02      # fraction of the budget spent warming the learning rate up
WARMDOWN_FRAC = 0.4     # final fraction of the budget spent decaying it linearly to 0
FINAL_LR_FRAC = 0.0     # learning rate at the end, as a fraction of the peak

COMPILE_ON_CPU = False  # torch.compile costs ~50 s cold on CPU and rarely pays back in 5 min
EVAL_BATCH = 32         # evaluation batch (halved automatically on out-of-memory)
LOG_EVERY_S = 5.0       # seconds between progress lines

# ---------------------------------------------------------------------------------
# Environment contract with the harness: every variable has a default for hand runs.

BUDGET_S = float(os.environ.get("AUTOLOOP_BUDGET_S", "300"))
SEED = int(os.environ.get("AUTOLOOP_SEED", "42"))


def pick_device() -> torch.device:
    wanted = os.environ.get("AUTOLOOP_DEVICE")
    if wanted:
        return torch.device(wanted)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


# ---------------------------------------------------------------------------------
# Model: pre-norm blocks with parameter-free RMSNorm, rotary positions, QK-norm,
# fused causal attention and a squared-ReLU MLP; no biases. Embedding and head are
# untied: with 256 bytes both are tiny, and each gets the learning rate it wants.


def rms_norm(x):
    return F.rms_norm(x, (x.size(-1),))


def rotary_tables(seq_len, head_dim, base, device):
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq)
    return angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]


def apply_rotary(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, N_HEADS, C // N_HEADS).unbind(2)
        # QK-norm keeps attention logits bounded, which permits higher learning rates.
        q, k = rms_norm(q), rms_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(WIDTH, MLP_RATIO * WIDTH, bias=False)
        self.proj = nn.Linear(MLP_RATIO * WIDTH, WIDTH, bias=False)

    def forward(self, x):
        return self.proj(F.relu(self.fc(x)).square())


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()
        self.mlp = MLP()

    def forward(self, x, cos, sin):
        x = x + self.attn(rms_norm(x), cos, sin)
        return x + self.mlp(rms_norm(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(256, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, 256, bias=False)
        max_len = max(SEQ_LEN, EVAL_CONTEXT)
        cos, sin = rotary_tables(max_len, WIDTH // N_HEADS, ROPE_BASE, self.embed.weight.device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        nn.init.normal_(self.embed.weight, std=1.0)
        for block in self.blocks:
            for lin in (block.attn.qkv, block.mlp.fc):
                bound = math.sqrt(3.0 / lin.in_features)  # uniform with unit-variance outputs
                nn.init.uniform_(lin.weight, -bound, bound)
            # Zero output projections: every block starts as the identity.
            nn.init.zeros_(block.attn.proj.weight)
            nn.init.zeros_(block.mlp.proj.weight)
        nn.init.zeros_(self.head.weight)

    def forward(self, x, y=None, reduction="mean"):
        T = x.size(1)
        h = rms_norm(self.embed(x))
        cos, sin = self.cos[:, :T], self.sin[:, :T]
        for block in self.blocks:
            h = block(h, cos, sin)
        logits = self.head(rms_norm(h)).float()
        logits = LOGIT_SOFTCAP * torch.tanh(logits / LOGIT_SOFTCAP)
        if y is None:
            return logits
        return F.cross_entropy(logits.view(-1, 256), y.reshape(-1), reduction=reduction)


# ---------------------------------------------------------------------------------
# Optimizer: Muon (momentum, then orthogonalised by a Newton-Schulz iteration) for the
# 2-D matrices inside the blocks, AdamW for the embedding and the head.


def newton_schulz(G, steps=5):
    """Approximately replace G by the nearest semi-orthogonal matrix (U V^T of its SVD)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.float()  # bf16 matmuls are slow on CPU; these matrices are small anyway
    transposed = X.size(0) > X.size(1)
    if transposed:
        X = X.T
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if transposed else X


class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr, momentum, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "buf" not in state:
                    state["buf"] = torch.zeros_like(p)
                buf = state["buf"]
                buf.lerp_(p.grad, 1 - group["momentum"])
                update = newton_schulz(p.grad.lerp(buf, group["momentum"]))
                # Scale so that tall and wide matrices get comparable per-element steps.
                scale = max(1.0, p.size(0) / p.size(1)) ** 0.5
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update.to(p.dtype), alpha=-group["lr"] * scale)


def build_optimizers(model):
    matrices = [p for p in model.blocks.parameters() if p.ndim == 2]
    adam = torch.optim.AdamW(
        [dict(params=[model.embed.weight], lr=EMBED_LR), dict(params=[model.head.weight], lr=HEAD_LR)],
        betas=ADAM_BETAS, eps=1e-10, weight_decay=0.0,
    )
    muon = Muon(matrices, lr=MATRIX_LR, momentum=MUON_MOMENTUM, weight_decay=WEIGHT_DECAY)
    optimizers = [adam, muon]
    for opt in optimizers:
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    return optimizers


def lr_multiplier(progress):
    """Learning-rate factor for the elapsed fraction of the budget: warmup, flat, warmdown."""
    if progress < WARMUP_FRAC:
        return (progress + 1e-3) / (WARMUP_FRAC + 1e-3)
    if progress < 1.0 - WARMDOWN_FRAC:
        return 1.0
    left = max(0.0, 1.0 - progress) / WARMDOWN_FRAC
    return FINAL_LR_FRAC + (1.0 - FINAL_LR_FRAC) * left


# ---------------------------------------------------------------------------------
# Accounting for the summary block.


def peak_memory_mb(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    # On CPU, the peak resident set of this process (ru_maxrss is KiB on Linux, bytes on macOS).
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


def peak_flops(device):
    """Dense bf16 peak of the accelerator, for MFU; None where no honest figure is known."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in (("H200", 989.5e12), ("H100", 989.5e12), ("A100", 312e12)):
        if key in name:
            return flops
    return None


def flops_per_token(model):
    """Training FLOPs per token: 6 x non-embedding params plus causal attention."""
    n = sum(p.numel() for p in model.blocks.parameters()) + model.head.weight.numel()
    return 6 * n + 6 * DEPTH * WIDTH * SEQ_LEN  # 12*L*C*T halved by the causal mask


def fail(message):
    print(f"FAIL: {message}", flush=True)
    sys.exit(1)


# ---------------------------------------------------------------------------------
# Training.


def main():
    t_start = time.time()
    torch.manual_seed(SEED)
    device = pick_device()
    dataset = load_data()
    model = GPT().to(device)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"device: {device}  params: {num_params / 1e6:.2f}M  budget: {BUDGET_S:.0f}s  "
          f"data: {dataset.fingerprint}", flush=True)

    optimizers = build_optimizers(model)
    use_compile = device.type == "cuda" or COMPILE_ON_CPU
    step_fn = torch.compile(model) if use_compile else model
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
                else torch.autocast(device.type, enabled=False))
    batches = dataset.batches(BATCH_SIZE, SEQ_LEN, device=device, seed=SEED)

    training_time, step, tokens, smooth_loss = 0.0, 0, 0, None
    first_loss, last_log = None, time.time()
    while training_time < BUDGET_S:
        t0 = time.time()
        progress = training_time / BUDGET_S if BUDGET_S > 0 else 1.0
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * lr_multiplier(progress)
        x, y = next(batches)
        with autocast:
            loss = step_fn(x, y)
        loss.backward()
        if GRAD_CLIP:
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)

        loss_value = loss.item()  # also synchronises the device, so dt is real
        if not math.isfinite(loss_value):
            fail(f"loss is {loss_value} at step {step}")
        first_loss = first_loss if first_loss is not None else loss_value
        if step > 10 and loss_value > 3 * first_loss:
            fail(f"loss exploded to {loss_value:.3f} at step {step} (started at {first_loss:.3f})")
        dt = time.time() - t0
        # The first steps pay for compilation and warm-up; they do not count against the budget.
        if step >= (10 if use_compile else 1):
            training_time += dt
        step += 1
        tokens += x.numel()
        smooth_loss = loss_value if smooth_loss is None else 0.9 * smooth_loss + 0.1 * loss_value
        if time.time() - last_log >= LOG_EVERY_S:
            last_log = time.time()
            print(f"step {step:05d} ({100 * min(progress, 1):.1f}%) | loss: {smooth_loss:.4f} | "
                  f"lrm: {lr_multiplier(progress):.2f} | dt: {dt * 1000:.0f}ms | "
                  f"tok/sec: {x.numel() / max(dt, 1e-9):,.0f} | remaining: {max(0, BUDGET_S - training_time):.0f}s",
                  flush=True)

    val_bpb = evaluate_bpb(model, batch_size=EVAL_BATCH, dataset=dataset)
    if not math.isfinite(val_bpb):
        fail(f"val_bpb is {val_bpb}")

    flops = peak_flops(device)
    mfu = 100 * flops_per_token(model) * tokens / max(training_time, 1e-9) / flops if flops else 0.0
    print("---")
    print(f"val_bpb:          {val_bpb:.6f}")
    print(f"training_seconds: {training_time:.1f}")
    print(f"total_seconds:    {time.time() - t_start:.1f}")
    print(f"peak_vram_mb:     {peak_memory_mb(device):.1f}")
    print(f"mfu_percent:      {mfu:.2f}")
    print(f"total_tokens_M:   {tokens / 1e6:.1f}")
    print(f"num_steps:        {step}")
    print(f"num_params_M:     {num_params / 1e6:.1f}")
    print(f"depth:            {DEPTH}", flush=True)


if __name__ == "__main__":
    main()
