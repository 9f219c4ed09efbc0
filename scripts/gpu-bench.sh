#!/usr/bin/env bash
# The GPU benchmarks (docs/gpu.md), from .gpu/ (scripts/gpu-package.sh): the MoE layer at the
# Qwen3-30B-A3B shape beside torch._grouped_mm and (when its anchor is present) sglang's Triton fused
# MoE in the same run, a synthesized 4-layer model's
# decode / prefill tokens/s, and (2 GPUs) dispatch + combine over NCCL beside a raw all-to-all.
# Tables on stdout; TSVs and logs in $OUT (or /tmp/epmoe-gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
out=${OUT:-/tmp/epmoe-gpu}
mkdir -p "$out"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
if ((ngpu >= 2)); then
  timeout 90 scripts/gpu-launch.sh 2 stdbuf -oL "$GPU_BIN/gpu_ep_bench" --out "$out/ep_bench.tsv" 2>&1 | tee "$out/ep_bench.log"
fi
timeout 120 stdbuf -oL "$GPU_BIN/gpu_moe_bench" --out "$out/moe_bench.tsv" 2>&1 | tee "$out/moe_bench.log"
# The peer in the same call (docs/gpu.md, issue 18): sglang's Triton fused MoE, when its anchor was
# copied into an ignored folder of the checkout (ANCHORS, default .gpu/anchors; ../shared does not
# travel with a GPU run).
anchors=${ANCHORS:-.gpu/anchors}
if [[ -f $anchors/sglang_fused_moe/bench.py ]]; then
  (cd "$anchors/sglang_fused_moe" && OUT="$out" PYTHONUNBUFFERED=1 timeout 200 python3 bench.py) 2>&1 | tail -8 |
    tee "$out/sglang.log"
  python3 scripts/gpu-side-by-side.py "$out/moe_bench.tsv" "$out/sglang_anchor.json" | tee "$out/side_by_side.md"
fi
PYTHONUNBUFFERED=1 timeout 120 python3 bench/cuda/torch_moe_bench.py --out "$out/torch_bench.tsv" 2>&1 |
  tee "$out/torch_bench.log"
python3 scripts/gpu-bench-table.py "$out/moe_bench.tsv" "$out/torch_bench.tsv" | tee "$out/moe_table.md"
timeout 100 stdbuf -oL "$GPU_BIN/gpu_model_bench" --out "$out/model_bench.tsv" 2>&1 | tee "$out/model_bench.log"
