"""A small byte-level GPT, trained for a fixed wall-clock budget, scored in val_bpb.

This is the ONE file a proposer edits. Everything about the model, the optimizer and
the training loop may change; the data, the evaluation and the harness may not (they
live in the `autoloop` package). Read it top to bottom: constants, device profiles,
model, optimizer, ranks, loop, evaluation, summary.

Contract with the harness (see program.md):
  * the model answers ``model(x, y, reduction="none")`` with per-byte losses in nats and
    must accept sequences up to EVAL_CONTEXT bytes, because evaluation uses that length;
  * training stops after AUTOLOOP_BUDGET_S seconds of training (start-up, compilation
    and evaluation excluded), then ``evaluate_bpb`` produces the metric;
  * the summary block below is printed last; on NaN or exploding loss it prints FAIL
    and exits non-zero.

Runs by hand with nothing set: ``python train.py`` (5 minutes, stdlib corpus). Over N GPUs
(or N CPU processes): ``python -m torch.distributed.run --standalone --nproc-per-node N train.py``.
"""

import math
import os
import re
import resource
import sys
import time
from contextlib import nullcontext
from datetime import timedelta

# CPU threads: torch's OpenMP workers spin while they wait for work. On a machine whose
# cores are shared (other jobs, parallel workers) the spinning takes the cores the real
# work waits for, and a step on 2 cores took 3-4x longer than on one. Waiting passively
# costs little when the machine is idle. Set before torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from autoloop.core.durations import default_timeout
from autoloop.data import load_data
from autoloop.evaluate import EVAL_CONTEXT, evaluate_bpb

# ---------------------------------------------------------------------------------
# Hyperparameters, sized for a 5-minute budget on 2 CPU cores (fp32). On a GPU the
# profile below scales the model and the batch up.

DEPTH = 3               # transformer blocks
WIDTH = 128             # model dimension
HEAD_DIM = 64           # attention head dimension (heads = WIDTH // HEAD_DIM)
MLP_RATIO = 4           # hidden width of the MLP relative to WIDTH
SEQ_LEN = 128           # training context in bytes; attention keeps to this window at evaluation too
BATCH_SIZE = 16         # sequences per step over all ranks together: 2,048 bytes, small steps and many of them
CONV_TAPS = 4           # each block first mixes every channel with its values 1..CONV_TAPS-1 bytes back (1: off)
VALUE_EMBEDS = True     # value embeddings: a per-byte table added to the attention values of alternate layers
BIGRAM_EMBED = True     # a learned vector per (previous byte, byte) pair added to the byte embedding
ROPE_BASE = 10000.0     # rotary position embedding base
LOGIT_SOFTCAP = 15.0    # tanh cap on the output logits: tames early spikes

MATRIX_LR = 0.04        # Muon learning rate for the 2-D weights inside the blocks
MUON_MOMENTUM = 0.95    # Muon (Nesterov) momentum, reached after MOMENTUM_WARMUP_FRAC of the budget
MOMENTUM_WARMUP_FRAC = 0.1  # momentum rises from 0.85 to MUON_MOMENTUM over this fraction of the budget
EMBED_LR = 0.6          # AdamW learning rate for the byte embedding and the value embeddings
HEAD_LR = 0.008         # AdamW learning rate for the output head
SCALAR_LR = 0.02        # AdamW learning rate for the per-layer scalars and the mixing taps
ADAM_BETAS = (0.8, 0.95)
WEIGHT_DECAY = 0.0      # cautious weight decay on the Muon matrices, decayed linearly to 0
GRAD_CLIP = 1.0         # global gradient-norm clip (0 disables)

WARMUP_FRAC = 0.02      # fraction of the budget spent warming the learning rate up
WARMDOWN_FRAC = 0.5     # final fraction of the budget spent decaying it linearly to FINAL_LR_FRAC
FINAL_LR_FRAC = 0.0     # learning rate at the end, as a fraction of the peak

COMPILE_ON_CPU = False  # torch.compile costs ~50 s cold on CPU and rarely pays back in 5 min
EVAL_BATCH = 32         # evaluation batch (halved automatically on out-of-memory)
LOG_EVERY_S = 5.0       # seconds between progress lines

# ---------------------------------------------------------------------------------
# Device profiles: how the constants above scale on each kind of device. WIDTH, DEPTH,
# BATCH_SIZE and SEQ_LEN are multiplied by the factors (SEQ_LEN stays <= EVAL_CONTEXT),
# the AdamW learning rates shrink by 1/sqrt(width factor) (wider models want smaller
# embedding steps), `bf16` runs the forward pass under bf16 autocast, `compile` wraps the
# model in torch.compile, `sparse` gives the bigram table a sparse gradient (SparseAdam
# then updates only the rows a step touched instead of all 65,536: on a CPU that is
# what keeps the table cheap; a GPU does the dense update in parallel, and it keeps the
# compiled graph simple), `fused` asks AdamW for its fused kernel. The profile of the
# detected device is used; AUTOLOOP_PROFILE picks one by name (AUTOLOOP_PROFILE=cpu trains the CPU sizes anywhere), and
# AUTOLOOP_SIZES=width,depth,batch,seq replaces its sizes but keeps its switches (the tests
# run the cuda profile's code paths, bf16 autocast and torch.compile, at CPU sizes).
#   cuda: 768 wide, 12 deep, 128 x 512 bytes per step: ~85M parameters in the blocks,
#         about GPT-2 small without its vocabulary (the bigram table adds 50M entries
#         that cost a lookup each), for one H100/H200-class GPU over 5 minutes;
#         a GPU with less memory trains the same batch in smaller micro-batches (micro_batch).
#   mps:  256 wide, 6 deep, 32 x 512 per step in fp32 (bf16 autocast on MPS is young).
PROFILES = {
    "cpu": dict(width=1, depth=1, batch=1, seq=1, bf16=False, compile=False, sparse=True, fused=False),
    "cuda": dict(width=6, depth=4, batch=8, seq=4, bf16=True, compile=True, sparse=False, fused=True),
    "mps": dict(width=2, depth=2, batch=2, seq=4, bf16=False, compile=False, sparse=False, fused=False),
}
CUDA_FULL_BATCH_GIB = 70  # one rank with less memory than this halves its micro-batch per halving of memory

# ---------------------------------------------------------------------------------
# Environment contract with the harness: every variable has a default for hand runs.

BUDGET_S = float(os.environ.get("AUTOLOOP_BUDGET_S", "300"))
SEED = int(os.environ.get("AUTOLOOP_SEED", "42"))
# The seed draws the initial weights; the order of the training windows stays the same for
# every seed (DATA_SEED), so two runs of one commit differ by their initialisation alone and
# two commits of a night see the same bytes in the same order. At 120 s on 2 CPU cores the
# order moved val_bpb three times as much as the initialisation did (sd over four seeds
# 0.020 with the order following the seed, 0.006 with it fixed). None: follow SEED.
DATA_SEED = 0
# A fixed number of steps instead of the budget (0: the budget decides), the schedules then
# following the step count: benchmarks/ddp_equivalence.py compares 1 and N ranks step for step.
MAX_STEPS = int(os.environ.get("AUTOLOOP_MAX_STEPS", "0"))
# Set by torch.distributed.run for each of its processes; a plain `python train.py` is rank 0 of 1.
RANK = int(os.environ.get("RANK", "0"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
# The trial's hard limit, after which the harness kills every rank (the default rule when run by hand).
HARD_TIMEOUT_S = float(os.environ.get("AUTOLOOP_TIMEOUT_S") or default_timeout(BUDGET_S))
# For tests: step 0 raises torch.OutOfMemoryError for micro-batches above this many sequences,
# as a GPU short of memory would, so the retry with a halved micro-batch runs on a CPU (0: never).
FORCE_OOM_ABOVE = int(os.environ.get("AUTOLOOP_FORCE_OOM_ABOVE", "0"))


def pick_device() -> torch.device:
    wanted = os.environ.get("AUTOLOOP_DEVICE")
    if wanted:
        device = torch.device(wanted)
        # Each rank of a multi-GPU trial takes the GPU of its local rank.
        return torch.device("cuda", LOCAL_RANK) if device.type == "cuda" and device.index is None else device
    if torch.cuda.is_available():
        return torch.device("cuda", LOCAL_RANK)
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def resolve_profile(device_type, gpu_memory_gib=None, name=None):
    """The sizes and switches this run trains with: the constants scaled by a profile."""
    name = name or os.environ.get("AUTOLOOP_PROFILE") or device_type
    if name not in PROFILES:
        fail(f"AUTOLOOP_PROFILE={name} is not one of {', '.join(PROFILES)}")
    p = PROFILES[name]
    width, depth, batch, seq_len = WIDTH * p["width"], DEPTH * p["depth"], BATCH_SIZE * p["batch"], SEQ_LEN * p["seq"]
    # The micro-batch one rank's memory holds: the full cuda batch in 70 GiB, halved per halving.
    micro = batch
    if name == "cuda" and gpu_memory_gib and gpu_memory_gib < CUDA_FULL_BATCH_GIB:
        micro = max(1, batch // 2 ** math.ceil(math.log2(CUDA_FULL_BATCH_GIB / gpu_memory_gib)))
    if os.environ.get("AUTOLOOP_SIZES"):
        try:
            width, depth, batch, seq_len = (int(v) for v in os.environ["AUTOLOOP_SIZES"].split(","))
        except ValueError:
            fail(f"AUTOLOOP_SIZES={os.environ['AUTOLOOP_SIZES']} is not width,depth,batch,seq (four integers)")
    return dict(name=name, width=width, depth=depth, batch=batch, memory_micro_batch=micro,
                seq_len=min(seq_len, EVAL_CONTEXT), lr_scale=p["width"] ** -0.5,
                bf16=p["bf16"], compile=p["compile"] or (name == "cpu" and COMPILE_ON_CPU),
                sparse_bigram=p["sparse"], fused=p["fused"])


def half_dtype(device):
    """The 16-bit type the `bf16` switch trains in: bf16 where the hardware has it (a CPU, and
    GPUs from sm80 on: A100, H100, ...). Below sm80 (T4, V100) bf16 has no tensor cores and runs
    emulated, so fp16 there, its gradients scaled by a GradScaler so that small ones do not
    underflow to zero."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] >= 8:
        return torch.bfloat16
    return torch.float16


# ---------------------------------------------------------------------------------
# Model: pre-norm blocks with parameter-free RMSNorm, a short causal channel mix, rotary
# positions, QK-norm, value embeddings, fused causal attention and a squared-ReLU MLP;
# no biases. Every block sees a learned mix of the stream and the normalised embedding.


def rms_norm(x):
    return F.rms_norm(x, (x.size(-1),))


def rotary_tables(seq_len, head_dim, base):
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq_len).float(), inv_freq)
    return angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]


def apply_rotary(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def bigram_ids(x):
    """The row of the bigram table for each byte: (previous byte, byte); the first byte of a
    window pairs with 0, the separator between documents."""
    return F.pad(x[:, :-1], (1, 0)) * 256 + x


def has_value_embed(layer, depth):
    """Alternate layers, the last one always included."""
    return VALUE_EMBEDS and layer % 2 == (depth - 1) % 2


class CausalMix(nn.Module):
    """x_t + sum_k w_k * x_{t-k} per channel: cheap local n-gram features for the block,
    so attention need not spend itself on the last few bytes. Starts as the identity."""

    def __init__(self, width):
        super().__init__()
        self.taps = nn.Parameter(torch.zeros(CONV_TAPS - 1, width))

    def forward(self, x):
        out = x
        for k in range(1, CONV_TAPS):
            out = out + self.taps[k - 1] * F.pad(x[:, :-k], (0, 0, k, 0))
        return out


class Attention(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        width = cfg["width"]
        self.n_heads = width // HEAD_DIM
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        # Value embeddings come in through a per-head gate on a slice of the input (2*sigmoid: 1 at init).
        self.ve_gate = nn.Linear(32, self.n_heads, bias=False) if has_value_embed(layer, cfg["depth"]) else None

    def forward(self, x, ve, cos, sin, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, HEAD_DIM).unbind(2)
        if ve is not None:
            v = v + 2 * torch.sigmoid(self.ve_gate(x[..., :32])).unsqueeze(-1) * ve.view(B, T, self.n_heads, HEAD_DIM)
        # QK-norm keeps attention logits bounded, which permits higher learning rates.
        q, k = apply_rotary(rms_norm(q), cos, sin), apply_rotary(rms_norm(k), cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, MLP_RATIO * width, bias=False)
        self.proj = nn.Linear(MLP_RATIO * width, width, bias=False)

    def forward(self, x):
        return self.proj(F.relu(self.fc(x)).square())


class Block(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        self.mix = CausalMix(cfg["width"]) if CONV_TAPS > 1 else nn.Identity()
        self.attn = Attention(cfg, layer)
        self.mlp = MLP(cfg["width"])

    def forward(self, x, ve, cos, sin, mask):
        x = x + self.attn(self.mix(rms_norm(x)), ve, cos, sin, mask)
        return x + self.mlp(rms_norm(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        width, depth = cfg["width"], cfg["depth"]
        self.window = cfg["seq_len"]
        self.embed = nn.Embedding(256, width)
        self.bigram = nn.Embedding(256 * 256, width, sparse=cfg["sparse_bigram"]) if BIGRAM_EMBED else None
        self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(256, width)
                                           for i in range(depth) if has_value_embed(i, depth)})
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(depth))
        self.head = nn.Linear(width, 256, bias=False)
        # Per layer: scale of the residual stream and weight of the embedding mixed back in.
        self.resid_scales = nn.Parameter(torch.ones(depth))
        self.x0_scales = nn.Parameter(torch.full((depth,), 0.1))
        cos, sin = rotary_tables(max(cfg["seq_len"], EVAL_CONTEXT), HEAD_DIM, ROPE_BASE)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self._masks = {}
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        nn.init.normal_(self.embed.weight, std=1.0)
        if self.bigram is not None:
            nn.init.zeros_(self.bigram.weight)   # starts as the byte embedding alone
        for block in self.blocks:
            for lin in (block.attn.qkv, block.mlp.fc):
                bound = math.sqrt(3.0 / lin.in_features)  # uniform with unit-variance outputs
                nn.init.uniform_(lin.weight, -bound, bound)
            # Zero output projections: every block starts as the identity.
            nn.init.zeros_(block.attn.proj.weight)
            nn.init.zeros_(block.mlp.proj.weight)
            if block.attn.ve_gate is not None:
                nn.init.zeros_(block.attn.ve_gate.weight)
        for table in self.value_embeds.values():
            bound = math.sqrt(3.0 / table.embedding_dim)
            nn.init.uniform_(table.weight, -bound, bound)
        nn.init.zeros_(self.head.weight)

    def window_mask(self, T, device):
        """Causal attention limited to the training window, for inputs longer than it
        (evaluation uses EVAL_CONTEXT): every position then sees as far back as in training."""
        if T <= self.window:
            return None
        if (T, device) not in self._masks:
            i = torch.arange(T, device=device)
            offset = i[:, None] - i[None, :]
            self._masks[(T, device)] = (offset >= 0) & (offset < self.window)
        return self._masks[(T, device)]

    def forward(self, x, y=None, reduction="mean"):
        T = x.size(1)
        cos, sin = self.cos[:, :T], self.sin[:, :T]
        mask = self.window_mask(T, x.device)
        h = self.embed(x)
        if self.bigram is not None:
            h = h + self.bigram(bigram_ids(x))
        h = x0 = rms_norm(h)
        for i, block in enumerate(self.blocks):
            h = self.resid_scales[i] * h + self.x0_scales[i] * x0
            ve = self.value_embeds[str(i)](x) if str(i) in self.value_embeds else None
            h = block(h, ve, cos, sin, mask)
        logits = self.head(rms_norm(h)).float()
        logits = LOGIT_SOFTCAP * torch.tanh(logits / LOGIT_SOFTCAP)
        if y is None:
            return logits
        return F.cross_entropy(logits.view(-1, 256), y.reshape(-1), reduction=reduction)


# ---------------------------------------------------------------------------------
# Optimizer: Muon for the 2-D matrices inside the blocks (Nesterov momentum, then an
# approximate orthogonalisation, then NorMuon's per-row normalisation), AdamW for the
# embeddings, the head, the scalars and the mixing taps.

# Polar Express (Amsel et al., 2025): per-iteration coefficients of the odd polynomial
# that drives the singular values to 1, converging in fewer steps than one fixed
# Newton-Schulz polynomial.
POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


def orthogonalize(G):
    """Approximately U V^T of the SVD of each matrix in the stack G (n, rows, cols)."""
    # 16 bits are exact enough and fast on a GPU (fp16 below sm80); on CPU bf16 matmuls are slow, so fp32.
    X = G.to(half_dtype(G.device)) if G.is_cuda else G.float()
    if X.size(-2) > X.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * 1.02 + 1e-6)
    for a, b, c in POLAR_EXPRESS:
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return X.mT if G.size(-2) > G.size(-1) else X


class Muon(torch.optim.Optimizer):
    """One step for all matrices of a shape at once (stacked), which keeps a GPU busy. Over N
    ranks each rank orthogonalises its own share of each stack (a 1/N slice) and the updated
    matrices are then gathered by every rank: the orthogonalisation (1.5 TFLOP a step on the
    cuda profile, a quarter of a rank's work at 8 ranks if every rank did all of it) is split
    instead. Each matrix's update is computed exactly as on one rank, so the model per step
    does not depend on the number of ranks."""

    def __init__(self, params, lr, momentum, weight_decay=0.0, beta2=0.95):
        shapes = sorted({p.shape for p in params})
        groups = [dict(params=[p for p in params if p.shape == s]) for s in shapes]
        super().__init__(groups, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, beta2=beta2))

    @torch.no_grad()
    def step(self):
        gathers = []
        for group in self.param_groups:
            every = [p for p in group["params"] if p.grad is not None]
            if not every:
                continue
            share = -(-len(every) // WORLD_SIZE)   # matrices per rank, the last rank's share padded
            params = every[RANK * share:(RANK + 1) * share]
            if params:
                self._update(group, params)
            if WORLD_SIZE > 1:
                gathers.append(gather_share(every, params, share))
        for finish in gathers:
            finish()

    def _update(self, group, params):
        """Nesterov momentum, orthogonalisation and NorMuon scaling for one stack of matrices."""
        state = self.state[params[0]]
        grads = torch.stack([p.grad for p in params])
        rows, cols = grads.shape[-2:]
        if "momentum" not in state:
            state["momentum"] = torch.zeros_like(grads)
            # NorMuon keeps one second moment per row (per column for wide matrices).
            state["v"] = torch.zeros(grads.shape[:-1] + (1,) if rows >= cols else
                                     grads.shape[:-2] + (1, cols), device=grads.device)
        state["momentum"].lerp_(grads, 1 - group["momentum"])
        update = orthogonalize(grads.lerp_(state["momentum"], group["momentum"])).float()
        # NorMuon: divide each row by its running RMS, then restore the update's overall norm.
        reduce_dim = -1 if rows >= cols else -2
        sq = update.square().mean(dim=reduce_dim, keepdim=True)
        state["v"].lerp_(sq, 1 - group["beta2"])
        scaled = update * state["v"].clamp_min(1e-10).rsqrt()
        update = scaled * (update.norm(dim=(-2, -1), keepdim=True)
                           / scaled.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-10))
        # Tall and wide matrices get comparable per-element steps.
        lr = group["lr"] * max(1.0, rows / cols) ** 0.5
        for p, u in zip(params, update.unbind(0), strict=True):
            if group["weight_decay"]:
                # Cautious weight decay: only where the update already pulls towards zero.
                p.sub_(lr * group["weight_decay"] * p * ((u * p) >= 0))
            p.sub_(u.to(p.dtype), alpha=lr)


def build_optimizers(model, cfg):
    matrices = [p for n, p in model.blocks.named_parameters() if p.ndim == 2 and ".mix." not in n]
    scalars = [model.resid_scales, model.x0_scales] + [p for n, p in model.blocks.named_parameters()
                                                       if ".mix." in n]
    tables = [model.embed.weight, *model.value_embeds.parameters()]
    sparse = [model.bigram.weight] if model.bigram is not None and model.bigram.sparse else []
    if model.bigram is not None and not sparse:
        tables.append(model.bigram.weight)
    fused = dict(fused=True) if cfg["fused"] else {}   # CUDA, and the CPU since torch 2.4
    s = cfg["lr_scale"]
    adam = torch.optim.AdamW([
        dict(params=tables, lr=EMBED_LR * s),
        dict(params=[model.head.weight], lr=HEAD_LR * s),
        dict(params=scalars, lr=SCALAR_LR),
    ], betas=ADAM_BETAS, eps=1e-10, weight_decay=0.0, **fused)
    muon = Muon(matrices, lr=MATRIX_LR, momentum=MUON_MOMENTUM, weight_decay=WEIGHT_DECAY)
    optimizers = [adam, muon]
    if sparse:   # Adam on the rows a step touched only
        sparse_adam = torch.optim.SparseAdam(sparse, betas=ADAM_BETAS, eps=1e-10)
        # Set after construction: SparseAdam refuses lr=0, and a frozen table is a fair experiment.
        sparse_adam.param_groups[0]["lr"] = EMBED_LR * s
        optimizers.append(sparse_adam)
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


def set_schedules(optimizers, progress):
    """Everything that follows the elapsed fraction of the budget, never the step count,
    so that a slower machine ends its budget annealed all the same."""
    muon = next(opt for opt in optimizers if isinstance(opt, Muon))
    lrm = lr_multiplier(progress)
    warm = min(1.0, progress / MOMENTUM_WARMUP_FRAC) if MOMENTUM_WARMUP_FRAC > 0 else 1.0
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * lrm
    for group in muon.param_groups:
        group["momentum"] = 0.85 + (MUON_MOMENTUM - 0.85) * warm
        group["weight_decay"] = WEIGHT_DECAY * (1.0 - progress)
    return lrm


# ---------------------------------------------------------------------------------
# Ranks: with WORLD_SIZE > 1 (torch.distributed.run) every rank holds the whole model and
# trains on its own slice of the global batch; the gradients are averaged, so every rank
# takes the same step and the model per step is the one a single rank would train.
#   * torch's DistributedDataParallel averages the dense gradients in buckets of 25 MB while
#     backward still runs (each bucket's all-reduce overlaps the rest of backward), and
#     torch.compile splits its graph at the buckets (DDPOptimizer) so the overlap survives
#     compilation. Hooks of our own could do the same; DDP is the tested one.
#   * The bigram table (65,536 x WIDTH, 50M entries on the cuda profile) is left out of DDP:
#     a step touches a few thousand of its rows, and every rank knows which (all ranks draw
#     the same global batch), so only those rows are averaged (average_bigram).
#   * Muon orthogonalises a 1/N share of the matrices on each rank, then gathers (Muon.step).
#   * Each rank splits its slice into micro-batches that its memory holds, accumulating the
#     gradients (micro_batch, forward_backward); out of memory at step 0 halves the micro-batch
#     and retries the same step, so the global batch, and the result, stay as they were.
#   * Every collective gives up after COLLECTIVE_TIMEOUT_S, well inside the trial's hard
#     timeout, so a rank whose peer died fails with NCCL's or gloo's own error in the log
#     instead of being killed silently by the harness.
# Only rank 0 evaluates and prints, after all ranks have left the group.

# Half of what the hard timeout leaves beyond the budget (150 s at the default 300 s budget):
# longer than ranks' compilations differ, short enough that start-up + budget + this wait
# ends before the harness's kill.
COLLECTIVE_TIMEOUT_S = max(30.0, (HARD_TIMEOUT_S - BUDGET_S) / 2)


def init_ranks(device):
    if device.type == "cuda":
        # Always, also for one rank: with --device cuda:1, allocations and torch.cuda's memory
        # counters would otherwise follow GPU 0.
        torch.cuda.set_device(device)
    if WORLD_SIZE > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
                                device_id=device if device.type == "cuda" else None)


def wrap_ranks(model, device):
    """The model under DDP over N ranks (the bigram table left to average_bigram); itself on one."""
    if WORLD_SIZE == 1:
        return model
    if model.bigram is not None:
        DDP._set_params_and_buffers_to_ignore_for_model(model, ["bigram.weight"])
    # The rotary tables are constant buffers: nothing to send each step.
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, forward_sync_buffers=False)


def rank_slice(x, y):
    """This rank's rows of the global batch. Every rank draws the same global batch (one
    seed), so the slices are disjoint and together they are what one rank would train on."""
    rows = x.size(0) // WORLD_SIZE
    return x[RANK * rows:(RANK + 1) * rows], y[RANK * rows:(RANK + 1) * rows]


def micro_batch(cfg):
    """Sequences per forward pass on this rank: its slice of the batch, or less where one
    rank's memory holds less (resolve_profile), a divisor of the slice so that every micro-batch
    is the same size and the mean of their losses is the slice's mean loss."""
    rows = cfg["batch"] // WORLD_SIZE
    micro = min(rows, cfg["memory_micro_batch"])
    while rows % micro:
        micro -= 1
    return micro


def forward_backward(step_fn, wrapped, autocast, scaler, x, y, micro, sync, step):
    """The mean loss over this rank's slice, its gradients accumulated micro-batch by
    micro-batch. DDP averages them over the ranks during the last backward when `sync`."""
    n = x.size(0) // micro
    total = 0.0
    for i in range(n):
        last = sync and i == n - 1
        with nullcontext() if wrapped is None or last else wrapped.no_sync():
            if step == 0 and FORCE_OOM_ABOVE and micro > FORCE_OOM_ABOVE:
                raise torch.OutOfMemoryError(f"AUTOLOOP_FORCE_OOM_ABOVE={FORCE_OOM_ABOVE}: "
                                             f"a micro-batch of {micro} sequences does not fit")
            with autocast:
                loss = step_fn(x[i * micro:(i + 1) * micro], y[i * micro:(i + 1) * micro])
            scaler.scale(loss / n).backward()   # fp16: scaled up (GradScaler); else as it is
        total = total + loss.detach()
    return total / n


def first_step(model, step_fn, wrapped, autocast, scaler, x, y, micro, device):
    """Step 0's forward and backward, with the micro-batch halved and the step retried while
    any rank runs out of memory; returns (loss, micro-batch). The gradients are accumulated
    without DDP and averaged by hand once all ranks agree the step fit: a rank out of memory
    half-way through backward would otherwise leave the others waiting in a bucket's all-reduce."""
    while True:
        try:
            loss = forward_backward(step_fn, wrapped, autocast, scaler, x, y, micro, sync=False, step=0)
            failed = False
        except torch.OutOfMemoryError:
            failed = True
        # Outside the except block: its traceback, holding the activations, is gone by now.
        if WORLD_SIZE > 1:
            flag = torch.tensor([float(failed)], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            failed = bool(flag.item())
        if not failed:
            average_gradients(model)
            return loss, micro
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if micro == 1:
            fail("out of memory at step 0 with a micro-batch of one sequence")
        micro //= 2
        while x.size(0) % micro:
            micro -= 1
        log(f"out of memory at step 0: micro-batch halved to {micro} sequences per rank "
            f"({x.size(0) // micro} accumulation steps), the step retried; the global batch is unchanged")


def average_gradients(model):
    """The mean dense gradient over the ranks in one flat all-reduce: DDP's work, done by hand
    for step 0 only (first_step). The bigram table is average_bigram's."""
    if WORLD_SIZE == 1:
        return
    dense = [p.grad for p in model.parameters()
             if p.grad is not None and (model.bigram is None or p is not model.bigram.weight)]
    flat = torch.cat([g.reshape(-1) for g in dense])
    dist.all_reduce(flat)
    for g, mean in zip(dense, (flat / WORLD_SIZE).split([g.numel() for g in dense]), strict=True):
        g.copy_(mean.view_as(g))


def average_bigram(model, x):
    """The bigram table's gradient averaged over the ranks on the rows the global batch `x`
    touched, the only rows with a gradient on any rank: a few thousand of 65,536. The gradient
    may be dense (cuda profile) or sparse (cpu profile, SparseAdam); the rows travel dense,
    which NCCL and gloo both reduce."""
    if WORLD_SIZE == 1 or model.bigram is None or model.bigram.weight.grad is None:
        return
    table = model.bigram.weight
    rows = bigram_ids(x).flatten().unique()
    if table.grad.is_sparse:
        grad = table.grad.coalesce()
        values = grad.values().new_zeros((rows.numel(), table.size(1)))
        values[torch.searchsorted(rows, grad.indices()[0])] = grad.values()
    else:
        values = table.grad.index_select(0, rows)
    dist.all_reduce(values)
    values /= WORLD_SIZE
    if table.grad.is_sparse:
        # unique() sorts: the rows are already coalesced.
        table.grad = torch.sparse_coo_tensor(rows[None], values, table.shape, is_coalesced=True,
                                             check_invariants=False)
    else:
        table.grad.index_copy_(0, rows, values)


def gather_share(every, mine, share):
    """Starts gathering every rank's share of one stack of Muon's matrices (`mine`, `share`
    matrices per rank, the last rank's padded); returns the function that waits for the
    gather and copies each matrix in, so that all gathers of a step travel at once."""
    shape = every[0].shape
    local = torch.stack(mine) if mine else every[0].new_zeros((0, *shape))
    if local.size(0) < share:
        local = torch.cat([local, local.new_zeros((share - local.size(0), *shape))])
    parts = [torch.empty_like(local) for _ in range(WORLD_SIZE)]
    work = dist.all_gather(parts, local, async_op=True)

    def finish():
        work.wait()
        for p, new in zip(every, torch.cat(parts).unbind(0), strict=False):   # the padding left out
            p.copy_(new)
    return finish


def shared_clock(loss_value, training_time, device):
    """(the mean loss over the ranks, rank 0's training clock), in one all-reduce per step.
    All ranks follow rank 0's clock, so all stop at the same step: ranks deciding on clocks
    of their own could stop a step apart and leave the others waiting in a collective."""
    if WORLD_SIZE == 1:
        return loss_value, training_time
    stats = torch.tensor([loss_value, training_time if RANK == 0 else 0.0], dtype=torch.float64, device=device)
    dist.all_reduce(stats)
    return stats[0].item() / WORLD_SIZE, stats[1].item()


def log(message):
    if RANK == 0:
        print(message, flush=True)


# ---------------------------------------------------------------------------------
# Accounting for the summary block.


def peak_memory_mb(device):
    if device.type == "cuda":
        # The trial's own GPU, and what the caching allocator held (reserved), not only what
        # tensors used: reserved memory is what another process could not have. The CUDA
        # context (some hundreds of MB, outside the allocator) is not counted.
        return torch.cuda.max_memory_reserved(device) / 2**20
    # On CPU, the peak resident set of this process (ru_maxrss is KiB on Linux, bytes on macOS).
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


# Dense bf16 tensor-core peak per GPU (no sparsity: the datasheets' "with sparsity" figures
# are twice these), from the vendors' datasheets, matched against torch's device name as
# whole words, most specific first ("H100 PCIe" before "H100"; "A10" is not "A100" or "A10G").
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12),     # NVIDIA H100 datasheet: PCIe 1,513 TFLOPS with sparsity
    ("H100 NVL", 835e12),      # NVIDIA H100 datasheet: NVL 1,671 with sparsity
    ("H200 NVL", 835e12),      # NVIDIA H200 datasheet: NVL 1,671 with sparsity
    ("H100", 989.4e12),        # NVIDIA H100 datasheet: SXM 1,979 with sparsity
    ("H200", 989.4e12),        # NVIDIA H200 datasheet: SXM 1,979 with sparsity
    ("GH200", 989.4e12),       # NVIDIA GH200 datasheet: 1,979 with sparsity
    ("B200", 2250e12),         # NVIDIA HGX B200: 36 PFLOPS with sparsity over 8 GPUs
    ("A100", 312e12),          # NVIDIA A100 datasheet: 40 and 80 GB, SXM and PCIe alike
    ("L40S", 362.05e12),       # NVIDIA L40S datasheet: 733 with sparsity
    ("A10", 125e12),           # NVIDIA A10 datasheet: 250 with sparsity
    ("RTX 4090", 165.2e12),    # NVIDIA Ada whitepaper: FP32 accumulate, 330.4 with sparsity
    ("RTX 5090", 209.5e12),    # NVIDIA Blackwell GeForce whitepaper: FP32 accumulate
    ("MI300X", 1307.4e12),     # AMD Instinct MI300X datasheet: 2,614.9 with sparsity
)


def peak_flops(device_name):
    """Dense bf16 peak of one GPU, for MFU; None where no honest figure is known."""
    for key, flops in PEAK_BF16_FLOPS:
        if re.search(rf"(?<!\w){re.escape(key)}(?!\w)", device_name):
            return flops
    return None


def matmul_params(model):
    """The weights every token is multiplied by: the blocks' matrices and the head. The byte,
    value and bigram tables are lookups (the bigram table alone is 65,536 x WIDTH), so they
    are left out, as scaling laws leave embeddings out of N in C = 6 N D."""
    matmuls = sum(p.numel() for n, p in model.blocks.named_parameters() if p.ndim == 2 and ".mix." not in n)
    return matmuls + model.head.weight.numel()


def flops_per_token(model, seq_len):
    """Training FLOPs per token: 6 per weight of every matmul (forward and backward), plus
    attention's 12 * layers * width * context (PaLM's convention, which counts the masked half)."""
    return 6 * matmul_params(model) + 12 * len(model.blocks) * model.embed.embedding_dim * seq_len


def fail(message):
    log(f"FAIL: {message}")
    sys.exit(1)


# ---------------------------------------------------------------------------------
# Training.


def main():
    # The monotonic clock for every duration: a wall clock stepped mid-run (NTP, a person) would
    # stretch or cut the budget by the step.
    t_start = time.perf_counter()
    torch.manual_seed(SEED)   # the same on every rank: all ranks start from the same weights
    device = pick_device()
    init_ranks(device)
    gpu_gib = torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda" else None
    cfg = resolve_profile(device.type, gpu_gib)
    if cfg["batch"] % WORLD_SIZE:
        fail(f"the batch of {cfg['batch']} sequences does not split over {WORLD_SIZE} ranks")
    micro = micro_batch(cfg)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for whatever stays in fp32
    dataset = load_data()
    model = GPT(cfg).to(device)
    num_params = sum(p.numel() for p in model.parameters())
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    peak = peak_flops(device_name)
    half = half_dtype(device)
    log(f"device: {device_name}{f' x {WORLD_SIZE} ranks' if WORLD_SIZE > 1 else ''}  profile: {cfg['name']} "
        f"({cfg['depth']} x {cfg['width']}, batch {cfg['batch']} x {cfg['seq_len']}"
        f"{(', bf16' if half == torch.bfloat16 else ', fp16 + GradScaler') if cfg['bf16'] else ''}"
        f"{', compiled' if cfg['compile'] else ''})  "
        f"params: {num_params / 1e6:.2f}M  budget: {BUDGET_S:.0f}s  data: {dataset.fingerprint}  "
        f"peak: {f'{peak / 1e12:g} TFLOPS bf16 per rank' if peak else 'unknown'}")

    optimizers = build_optimizers(model, cfg)
    # The bigram table is left out of clipping: its rows get few, Adam-normalised updates
    # (and a sparse gradient has no norm in torch).
    clipped = [p for p in model.parameters() if model.bigram is None or p is not model.bigram.weight]
    wrapped = wrap_ranks(model, device)
    step_fn = torch.compile(wrapped, dynamic=False) if cfg["compile"] else wrapped
    wrapped = wrapped if WORLD_SIZE > 1 else None
    autocast = torch.autocast(device.type, dtype=half, enabled=cfg["bf16"])
    # fp16's gradients are scaled up through backward and back down before the step (skipped on inf).
    scaler = torch.amp.GradScaler("cuda", enabled=cfg["bf16"] and half == torch.float16)
    # Every rank draws the same global batch and trains on its own slice (rank_slice).
    batches = dataset.batches(cfg["batch"], cfg["seq_len"], device=device,
                              seed=SEED if DATA_SEED is None else DATA_SEED)
    warmup_steps = 10 if cfg["compile"] else 1

    training_time, warmup_time, step, tokens, timed_tokens, smooth_loss = 0.0, 0.0, 0, 0, 0, None
    first_loss, last_log = None, time.perf_counter()
    while (step < MAX_STEPS) if MAX_STEPS else (training_time < BUDGET_S):
        t0 = time.perf_counter()
        progress = step / MAX_STEPS if MAX_STEPS else training_time / BUDGET_S if BUDGET_S > 0 else 1.0
        lrm = set_schedules(optimizers, progress)
        x, y = next(batches)
        if step == 0:
            loss, micro = first_step(model, step_fn, wrapped, autocast, scaler, *rank_slice(x, y), micro, device)
        else:
            loss = forward_backward(step_fn, wrapped, autocast, scaler, *rank_slice(x, y), micro, sync=True,
                                    step=step)
        average_bigram(model, x)
        for opt in optimizers:
            scaler.unscale_(opt)
        if GRAD_CLIP:
            torch.nn.utils.clip_grad_norm_(clipped, GRAD_CLIP)
        for opt in optimizers:
            scaler.step(opt)
        scaler.update()
        model.zero_grad(set_to_none=True)

        loss_value = loss.item()  # also synchronises the device, so dt is real
        dt = time.perf_counter() - t0
        # The first steps pay for compilation and warm-up; they do not count against the budget.
        if step >= warmup_steps:
            training_time += dt
            timed_tokens += x.numel()
        else:
            warmup_time += dt
        loss_value, training_time = shared_clock(loss_value, training_time, device)
        if not math.isfinite(loss_value):
            fail(f"loss is {loss_value} at step {step}")
        first_loss = first_loss if first_loss is not None else loss_value
        if step > 10 and loss_value > 3 * first_loss:
            fail(f"loss exploded to {loss_value:.3f} at step {step} (started at {first_loss:.3f})")
        step += 1
        tokens += x.numel()   # the global batch: all ranks together
        smooth_loss = loss_value if smooth_loss is None else 0.9 * smooth_loss + 0.1 * loss_value
        if time.perf_counter() - last_log >= LOG_EVERY_S:
            last_log = time.perf_counter()
            log(f"step {step:05d} ({100 * min(progress, 1):.1f}%) | loss: {smooth_loss:.4f} | "
                f"lrm: {lrm:.2f} | dt: {dt * 1000:.0f}ms | "
                f"tok/sec: {x.numel() / max(dt, 1e-9):,.0f} | remaining: {max(0, BUDGET_S - training_time):.0f}s")

    log(f"warm-up: {min(step, warmup_steps)} steps in {warmup_time:.1f} s (compilation included), not timed")
    accum = cfg["batch"] // WORLD_SIZE // micro
    log(f"memory: micro-batch {micro} sequences per rank, {accum} accumulation step{'s' if accum > 1 else ''} "
        f"per step of {cfg['batch']}")
    if WORLD_SIZE > 1:
        # Every rank leaves the group here, after the last collective: rank 0 then evaluates
        # alone, with no peer waiting on it into a timeout.
        dist.destroy_process_group()
    if RANK != 0:   # rank 0 evaluates and reports; the others are done
        return
    if device.type == "cpu" and WORLD_SIZE > 1:   # the other ranks' cores are free now
        torch.set_num_threads(torch.get_num_threads() * int(os.environ.get("LOCAL_WORLD_SIZE", WORLD_SIZE)))
    # The evaluation batch follows what one rank's memory held in training (its micro-batch).
    val_bpb = evaluate_bpb(model, batch_size=max(1, EVAL_BATCH * micro * WORLD_SIZE // BATCH_SIZE), dataset=dataset)
    if not math.isfinite(val_bpb):
        fail(f"val_bpb is {val_bpb}")

    # Rank 0's clock is every rank's (shared_clock); tokens are the global batch's.
    tokens_per_s = timed_tokens / max(training_time, 1e-9)
    mfu = 100 * flops_per_token(model, cfg["seq_len"]) * tokens_per_s / (peak * WORLD_SIZE) if peak else math.nan
    if not peak:   # nan, not words: a parser of the block reads every value with float()
        log(f"mfu_percent is nan: no dense bf16 peak is known for {device_name} (PEAK_BF16_FLOPS)")
    # Above one epoch val_bpb ranks memorisation: the default corpus is ~10 MB, a GPU reads that in seconds.
    epochs = tokens / len(dataset.split("train"))
    if epochs > 1:
        log(f"WARNING: {epochs:.1f} epochs over the training bytes: val_bpb ranks memorisation, not learning; "
            "a larger corpus fixes it: autoloop prepare --corpus climbmix, then autoloop run --corpus climbmix")
    if scaler.is_enabled():   # said beside the block, which stays numbers only
        log(f"precision: fp16 autocast with a GradScaler, not bf16: {device_name} (sm "
            f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}) has no bf16 tensor cores")
    print("---")
    print(f"val_bpb:          {val_bpb:.6f}")
    print(f"training_seconds: {training_time:.1f}")
    print(f"total_seconds:    {time.perf_counter() - t_start:.1f}")
    print(f"peak_vram_mb:     {peak_memory_mb(device):.1f}")
    print(f"mfu_percent:      {mfu:.2f}")
    # Three decimals, not autoresearch's one: a CPU's models have under a million matmul weights
    # and a short run's tokens are a fraction of a million; `autoloop ladder` reads both.
    print(f"total_tokens_M:   {tokens / 1e6:.3f}")
    print(f"num_steps:        {step}")
    print(f"num_params_M:     {num_params / 1e6:.3f}")
    print(f"depth:            {cfg['depth']}")
    print(f"matmul_params_M:  {matmul_params(model) / 1e6:.3f}")   # N of C = 6 N D (autoloop ladder)
    print(f"tokens_per_sec:   {tokens_per_s:.0f}")
    print(f"world_size:       {WORLD_SIZE}")
    print(f"micro_batch:      {micro}")   # sequences per forward pass on a rank (the batch is unchanged)
    print(f"accum_steps:      {accum}")
    print(f"epochs:           {epochs:.3f}", flush=True)   # passes over the training bytes


if __name__ == "__main__":
    # Under torch.distributed.run, record() writes a failing rank's traceback to the error file
    # the launcher names in its report, so the harness sees that rank's own exception.
    # (imported only then: a single-rank run, every scout run, skips torch's elastic launcher).
    if WORLD_SIZE > 1:
        from torch.distributed.elastic.multiprocessing.errors import record
        record(main)()
    else:
        main()
