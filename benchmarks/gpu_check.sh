#!/usr/bin/env bash
# Does the default train.py use a GPU well, over one GPU and two, and does a night run on it?
#
#   bash benchmarks/gpu_check.sh             # under 8 minutes on one H100/H200
#   bash benchmarks/gpu_check.sh --dry-run   # prints the plan, then runs every step on the CPU in miniature
#
# 1. The environment: nvidia-smi, torch and its CUDA version.
# 2. train.py's cuda profile (bf16 autocast, torch.compile, fused AdamW) for 60 s, then 300 s:
#    val_bpb, tokens/s, MFU, peak VRAM, warm-up (compilation) seconds, and recompilations after
#    warm-up (TORCH_LOGS=recompiles; the goal is none).
# 3. The same bytes through autoresearch's recipe for 300 s, where AUTORESEARCH_DIR names a copy
#    of it (its train.py and prepare.py); skipped with a line otherwise.
# 4. A 2-GPU trial (torch.distributed.run, 60 s) where two GPUs are visible; skipped otherwise.
# 5. A 3-trial night: `autoloop run --budget 60s` with the offline mutator, then its results.tsv.
# Goals for a real run (targets, not tests): MFU >= 40 % on H100/H200 at 300 s, no recompilation
# after warm-up, peak VRAM within the card. Record the figures in docs/gpu.md with the date and GPU.
# --dry-run: the same steps on the CPU at tiny sizes and budgets, so the script itself cannot rot.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
[ $# -gt 0 ] && [ "$DRY" = 0 ] && { echo "usage: bash benchmarks/gpu_check.sh [--dry-run]" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/autoloop-gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
if [ "$DRY" = 1 ]; then
    # 1 s and 2 s: a long run still longer than the short one; what is checked is that each
    # step runs and reports, not what seconds buy (3, 4 and 2 s cost the suite ~10 s more).
    SHORT=1; LONG=2; NIGHT=1; DEVICE=cpu
    # The CPU stand-in: the cpu profile at a tiny size on a small corpus (compilation is the
    # suite's test_cuda_profile_code_paths_run_on_the_cpu; here it would only cost minutes).
    export AUTOLOOP_PROFILE=cpu AUTOLOOP_SIZES=64,1,8,64 AUTOLOOP_DATA_DIR="$work/data"
    python -c "from autoloop.data import CorpusSpec, prepare; prepare(CorpusSpec(val_bytes=8192, audit_bytes=2048), '$work/data')" >/dev/null
    echo "gpu_check --dry-run: the plan below, each step on the CPU at tiny sizes"
else
    SHORT=60; LONG=300; NIGHT=60; DEVICE=cuda
fi

summary() {   # the figures of one train.py log
    python - "$1" "$2" <<'EOF'
import re, sys
text, label = open(sys.argv[1]).read(), sys.argv[2]
s = dict(re.findall(r"^(\w+):\s+(.+)$", text.split("\n---\n")[-1], re.M))
if "val_bpb" not in s:
    sys.exit(f"gpu_check: {label}: train.py printed no summary block (see {sys.argv[1]})")
warm = re.search(r"^warm-up: \d+ steps in ([\d.]+) s", text, re.M)
recompiles = len(re.findall(r"Recompiling function", text))
mfu = s["mfu_percent"] + (" %" if s["mfu_percent"][0].isdigit() else "")
print(f"{label}: val_bpb {float(s['val_bpb']):.4f}, {float(s['tokens_per_sec']):,.0f} tokens/s, MFU {mfu}, "
      f"peak VRAM {float(s['peak_vram_mb']) / 1024:.1f} GiB, warm-up {warm.group(1) if warm else '?'} s, "
      f"{s['num_steps']} steps, {recompiles} recompilation(s), {s['world_size']} rank(s)")
EOF
}

train() {   # label, budget, [launcher args...]
    local label=$1 budget=$2; shift 2
    echo "== $label: train.py on $DEVICE for ${budget} s"
    TORCH_LOGS=recompiles AUTOLOOP_DEVICE=$DEVICE AUTOLOOP_BUDGET_S=$budget \
        python "$@" train.py >"$work/$label.log" 2>&1 || { tail -30 "$work/$label.log"; echo "gpu_check: $label failed"; exit 1; }
    summary "$work/$label.log" "$label"
}

echo "== 1. environment"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
    nvidia-smi topo -m || true
else
    echo "no nvidia-smi on this machine"
fi
# One interpreter for both (importing torch takes seconds, more on a loaded machine): the count, then the line.
found=$(python -c "import torch; n = torch.cuda.device_count(); print(n, f'torch {torch.__version__}, CUDA {torch.version.cuda}, {n} GPU(s) visible')")
GPUS=${found%% *}
echo "${found#* }"
if [ "$DRY" = 0 ] && [ "$GPUS" = 0 ]; then
    echo "gpu_check: no CUDA device visible to torch; run with --dry-run to try the script on the CPU"; exit 1
fi

echo; echo "== 2. train.py's ${DEVICE/cpu/cpu stand-in for the cuda} profile"
train "short" "$SHORT"
train "long" "$LONG"

echo; echo "== 3. autoresearch's recipe on the same bytes"
if [ -n "${AUTORESEARCH_DIR:-}" ] && [ -f "$AUTORESEARCH_DIR/train.py" ] && [ "$DRY" = 0 ]; then
    (cd "$AUTORESEARCH_DIR" && AUTOLOOP_BUDGET_S=$LONG timeout 900 python train.py) >"$work/autoresearch.log" 2>&1 \
        && grep -E "^(val_bpb|mfu_percent|peak_vram_mb|num_steps):" "$work/autoresearch.log" \
        || echo "autoresearch's recipe failed (see its log, kept in $work until the end)"
else
    echo "skipped: $([ "$DRY" = 1 ] && echo "a dry run" || echo "no copy of autoresearch at hand (set AUTORESEARCH_DIR to one)")"
fi

echo; echo "== 4. a trial over 2 ranks"
if [ "$DRY" = 1 ] || [ "$GPUS" -ge 2 ]; then
    train "two-ranks" "$SHORT" -m torch.distributed.run --standalone --nproc-per-node 2
else
    echo "skipped: one GPU visible"
fi

echo; echo "== 5. a 3-trial night with the mutator at ${NIGHT} s"
python -m autoloop.cli init "$work/exp" >/dev/null
(cd "$work/exp" && python -m autoloop.cli run --proposer mutate --budget "$NIGHT" --max-trials 3 \
    --noise-runs 0 --device "$DEVICE" --tag gpucheck ${AUTOLOOP_DATA_DIR:+--data-dir "$AUTOLOOP_DATA_DIR"})
echo "== results.tsv"
cat "$work/exp/results/results.tsv"
echo; echo "gpu_check: done$([ "$DRY" = 1 ] && echo ' (dry run on the CPU: no GPU figures)')"
