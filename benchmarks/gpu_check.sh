#!/usr/bin/env bash
# Does the default train.py use a CUDA GPU well, and does a night run on it?
#
#   bash benchmarks/gpu_check.sh            # ~10 minutes on one H100/H200
#
# 1. Trains this checkout's train.py for 60 s on the GPU (its CUDA profile: bf16 autocast,
#    torch.compile, fused attention) and prints tokens/s, MFU and peak memory.
# 2. Runs a 3-trial night in a scratch experiment repository: `autoloop run` with the
#    offline mutator at a 60 s budget (baseline + 3 trials, no noise runs, to keep it short),
#    then prints its results.tsv.
# Needs a CUDA build of torch and a visible GPU; stops with one line otherwise.
# CHECK_BUDGET (seconds, default 60) shortens or lengthens both parts.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
BUDGET=${CHECK_BUDGET:-60}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

python - <<'EOF' || exit 1
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: no CUDA device visible to torch {torch.__version__}; this check needs a GPU")
p = torch.cuda.get_device_properties(0)
print(f"gpu: {p.name}, {p.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF

work=$(mktemp -d "${TMPDIR:-/tmp}/autoloop-gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo
echo "== 1. train.py for ${BUDGET} s on cuda"
AUTOLOOP_DEVICE=cuda AUTOLOOP_BUDGET_S="$BUDGET" AUTOLOOP_RESULT="$work/result.json" \
    python train.py 2>&1 | tee "$work/train.log"
python - "$work/train.log" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
s = {k: float(v) for k, v in re.findall(r"^(\w+):\s+([-\d.]+)$", text, re.M)}
if "val_bpb" not in s:
    sys.exit("gpu_check: train.py printed no summary block (see above)")
# The progress lines' tok/sec are timed steps only; total_tokens_M also counts the untimed
# compilation steps, so it serves only when no progress line was printed.
rates = sorted(float(r.replace(",", "")) for r in re.findall(r"tok/sec: ([\d,]+)", text))
tok_s = rates[len(rates) // 2] if rates else s["total_tokens_M"] * 1e6 / max(s["training_seconds"], 1e-9)
print(f"\ntokens/s: {tok_s:,.0f} (median step)   MFU: {s['mfu_percent']:.1f} %   peak memory: {s['peak_vram_mb'] / 1024:.1f} GiB   "
      f"val_bpb: {s['val_bpb']:.4f} after {s['num_steps']:.0f} steps ({s['total_seconds']:.0f} s in all)")
if s["mfu_percent"] == 0:
    print("(MFU 0: this GPU's bf16 peak is not in train.py's PEAK_BF16_FLOPS table)")
EOF

echo
echo "== 2. a 3-trial night with the mutator at ${BUDGET} s"
# PYTHONPATH points at this checkout, so init copies its train.py (templates/train.py links to it).
python -m autoloop.cli init "$work/exp" >/dev/null
(cd "$work/exp" && python -m autoloop.cli run --proposer mutate --budget "$BUDGET" --max-trials 3 \
    --noise-runs 0 --device cuda --tag gpucheck)
echo
echo "== results.tsv"
cat "$work/exp/results/results.tsv"
