#!/usr/bin/env bash
# Does the default train.py use a GPU well, and does a night run on it? In one command, in at
# most 8 minutes on one GPU (estimate: docs/gpu.md), every log and figure kept under $OUT.
#
#   OUT=/some/dir bash benchmarks/gpu_check.sh             # on a GPU machine
#   OUT=/some/dir bash benchmarks/gpu_check.sh --dry-run   # the same steps on the CPU in miniature
#
# 1. The environment: GPU, driver, torch, CUDA, sm, free memory.
# 2. One 300 s run of train.py's cuda profile, with recompilations and graph breaks counted
#    (TORCH_LOGS=recompiles,graph_breaks) and the GPU's memory sampled by nvidia-smi every 0.5 s.
# 3. A mini-night: `autoloop run` with the offline mutator, a baseline and one change (--max-trials
#    counts the changes) at a 10 s budget, at a cut-down size (the loop's machinery on the GPU,
#    not the model's figures).
# 4. A trial over 2 ranks (torch.distributed.run, 60 s) where two GPUs are visible.
# Each figure is printed as `name: value`, the names those of docs/gpu.md's table, and written to
# $OUT/figures.txt; a figure that cannot be had here is `nan`. Each step has a hard limit, so on
# one GPU the whole stays under the 10 minutes one command may take on a lent machine.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
[ $# -gt 0 ] && [ "$DRY" = 0 ] && { echo "usage: bash benchmarks/gpu_check.sh [--dry-run]" >&2; exit 2; }

OUT=${OUT:-${TMPDIR:-/tmp}/autoloop-gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
: >"$OUT/figures.txt"
T0=$(date +%s)
if [ "$DRY" = 1 ]; then
    # What is checked is that each step runs and reports, not what seconds buy.
    LONG=2; NIGHT=1; TWO=1; DEVICE=cpu; LONG_LIMIT=300; NIGHT_LIMIT=300
    # The CPU stand-in: the cpu profile at a tiny size on a small corpus (compilation is the
    # suite's test_cuda_profile_code_paths_run_on_the_cpu; here it would only cost minutes).
    export AUTOLOOP_PROFILE=cpu AUTOLOOP_SIZES=64,1,8,64 AUTOLOOP_DATA_DIR="$OUT/data"
    NIGHT_SIZES=64,1,8,64
    python -c "from autoloop.data import CorpusSpec, prepare; prepare(CorpusSpec(val_bytes=8192, audit_bytes=2048), '$OUT/data')" >/dev/null
    echo "gpu_check --dry-run: each step on the CPU at tiny sizes; logs in $OUT"
else
    # Limits: the 300 s run with start-up, a cold compilation and evaluation in 420 s; the
    # mini-night's two trials in 150 s; the 2-rank trial in 150 s (two GPUs only).
    LONG=300; NIGHT=10; TWO=60; DEVICE=cuda; LONG_LIMIT=420; NIGHT_LIMIT=150
    NIGHT_SIZES=256,2,32,512
    echo "gpu_check: logs in $OUT"
fi

figure() {   # name value: printed and kept
    echo "$1: $2"
    echo "$1: $2" >>"$OUT/figures.txt"
}

summary() {   # log prefix [sampled memory file]: the figures of one train.py log
    python - "$1" "$2" "${3:-}" >>"$OUT/figures.txt" <<'EOF'
import math, re, sys
path, prefix, samples = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(path, errors="replace").read()
s = dict(re.findall(r"^(\w+):\s+(\S+)$", text.split("\n---\n")[-1], re.M))
if "val_bpb" not in s:
    sys.exit(f"gpu_check: {prefix}: train.py printed no summary block (see {path})")
def number(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan
warm = re.search(r"^warm-up: \d+ steps in ([\d.]+) s", text, re.M)
sampled = math.nan
if samples:
    values = [number(v) for v in open(samples).read().split()]
    sampled = max((v for v in values if v == v), default=math.nan)
figures = {"val_bpb": number(s["val_bpb"]), "tokens_per_sec": number(s.get("tokens_per_sec")),
           "mfu_percent": number(s.get("mfu_percent")), "peak_vram_mb": number(s.get("peak_vram_mb")),
           "sampled_vram_mb": sampled, "warmup_s": number(warm.group(1) if warm else None),
           "num_steps": number(s.get("num_steps")), "micro_batch": number(s.get("micro_batch")),
           # Each rank logs its own; a count per rank.
           "recompiles": len(re.findall(r"Recompiling function", text)) / number(s.get("world_size")),
           "graph_breaks": len(re.findall(r"Graph Break Reason", text)) / number(s.get("world_size")),
           "world_size": number(s.get("world_size"))}
for name, value in figures.items():
    print(f"{prefix}_{name}: {value:g}")
EOF
    grep "^$2_" "$OUT/figures.txt"
}

train() {   # label budget limit [launcher args...]
    local label=$1 budget=$2 limit=$3 sampler=""; shift 3
    echo "== $label: train.py on $DEVICE for ${budget} s (at most ${limit} s)"
    if [ "$DRY" = 0 ] && command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 >"$OUT/$label.vram_mb" 2>/dev/null &
        sampler=$!
    fi
    local rc=0
    TORCH_LOGS=recompiles,graph_breaks AUTOLOOP_DEVICE=$DEVICE AUTOLOOP_BUDGET_S=$budget \
        timeout -k 10 "$limit" python "$@" train.py >"$OUT/$label.log" 2>&1 || rc=$?
    [ -n "$sampler" ] && { kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true; }
    if [ "$rc" != 0 ]; then
        tail -30 "$OUT/$label.log"; echo "gpu_check: $label failed (exit $rc; log: $OUT/$label.log)"; exit 1
    fi
    summary "$OUT/$label.log" "$label" "$([ -n "$sampler" ] && echo "$OUT/$label.vram_mb")"
}

echo "== 1. environment"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
    nvidia-smi topo -m >>"$OUT/nvidia-smi.txt" 2>&1 || true
fi
python - "$OUT/figures.txt" <<'EOF' | tee "$OUT/environment.txt"
import subprocess, sys, torch
n = torch.cuda.device_count()
figures = {"torch": torch.__version__, "cuda": torch.version.cuda or "none", "gpus": n}
if n:
    free, total = torch.cuda.mem_get_info(0)
    major, minor = torch.cuda.get_device_capability(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.split("\n")[0].strip() or "nan"
    except OSError:
        driver = "nan"
    figures.update(gpu=torch.cuda.get_device_name(0).replace(" ", "_"), sm=f"{major}.{minor}", driver=driver,
                   gpu_free_mb=f"{free / 2**20:.0f}", gpu_total_mb=f"{total / 2**20:.0f}")
else:
    figures.update(gpu="none", sm="nan", driver="nan", gpu_free_mb="nan", gpu_total_mb="nan")
with open(sys.argv[1], "a") as f:
    for name, value in figures.items():
        print(f"{name}: {value}")
        f.write(f"{name}: {value}\n")
EOF
GPUS=$(sed -n 's/^gpus: //p' "$OUT/environment.txt")
if [ "$DRY" = 0 ] && [ "$GPUS" = 0 ]; then
    echo "gpu_check: no CUDA device visible to torch; run with --dry-run to try the script on the CPU"; exit 1
fi

echo; echo "== 2. one ${LONG} s run of train.py's ${DEVICE/cpu/cpu stand-in for the cuda} profile"
train long "$LONG" "$LONG_LIMIT"

echo; echo "== 3. a mini-night: a baseline and one change at ${NIGHT} s"
python -m autoloop.cli init "$OUT/night" >/dev/null
(cd "$OUT/night" && AUTOLOOP_SIZES=$NIGHT_SIZES timeout -k 10 "$NIGHT_LIMIT" python -m autoloop.cli run \
    --proposer mutate --budget "$NIGHT" --max-trials 1 --noise-runs 0 --device "$DEVICE" --tag gpucheck \
    ${AUTOLOOP_DATA_DIR:+--data-dir "$AUTOLOOP_DATA_DIR"}) >"$OUT/night.log" 2>&1 \
    || { tail -30 "$OUT/night.log"; echo "gpu_check: the mini-night failed (log: $OUT/night.log)"; exit 1; }
cp "$OUT/night/results/results.tsv" "$OUT/night-results.tsv"
cat "$OUT/night-results.tsv"
figure night_trials "$(($(wc -l <"$OUT/night-results.tsv") - 1))"
stopped=$(grep -o 'stopped: [^.]*' "$OUT/night.log" | tail -1 | sed 's/^stopped: //' | tr ' ' '_')
figure night_stopped "${stopped:-nan}"

echo; echo "== 4. a trial over 2 ranks"
if [ "$DRY" = 1 ] || [ "$GPUS" -ge 2 ]; then
    train two_ranks "$TWO" 150 -m torch.distributed.run --standalone --nproc-per-node 2
else
    echo "skipped: one GPU visible"
    for name in val_bpb tokens_per_sec mfu_percent world_size; do figure "two_ranks_$name" nan; done
fi

figure gpu_check_seconds "$(($(date +%s) - T0))"
echo; echo "gpu_check: done$([ "$DRY" = 1 ] && echo ' (dry run on the CPU: no GPU figures)'); everything in $OUT"
