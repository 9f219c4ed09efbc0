#!/usr/bin/env bash
# The kernel paths written without a GPU and kept opt-in until one checks them (run 22, issue 33):
#   EPMOE_RMSNORM_REGS=1      RMSNorm with the row in registers (H <= 4096)
#   EPMOE_ATTN_EARLY_TILES=1  decode attention requests earlier positions' K/V tiles before its wait
#   EPMOE_ROUTER_ROUTES=1     decode steps routed by the router's last CTA
#   EPMOE_NORM_SPLITS=1 / 2   the input norm and decode attention write split_gemv's x fragments
#                             (2: the norm triggers the q/k/v projection after its stores)
# On one GPU, from .gpu/ (scripts/gpu-package.sh): every GPU test with all three on (the default
# paths ran in scripts/gpu-test.sh); scripts/gpu-same-bits.sh of the binary against itself with
# them on (every fixture's logits and two greedy rollouts must be the same bytes); then the
# 48-layer decode bench at 1 / 8 / 64 sequences, alternating off / all on / run 22's three /
# each EPMOE_NORM_SPLITS, two rounds. A switch whose tests and bits pass and whose bench row wins becomes the
# default (docs/gpu.md: "Not done"). Logs under OUT. Exit status 0 when the tests and bits pass.
# STEPS (default "tests bits bench") picks the parts -- all three may not fit one 10-minute device
# call: STEPS="tests bits" then STEPS=bench; ROUNDS (2) the bench's rounds.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
out=${OUT:-/tmp/epmoe-gpu}
mkdir -p "$out"
on=(EPMOE_RMSNORM_REGS=1 EPMOE_ATTN_EARLY_TILES=1 EPMOE_ROUTER_ROUTES=1 EPMOE_NORM_SPLITS=1)
steps=" ${STEPS:-tests bits bench} "
status=0
if [[ $steps == *" tests "* ]]; then
  echo "=== gpu_test with ${on[*]}"
  env "${on[@]}" timeout 300 "$GPU_BIN/gpu_test" --gtest_color=no > "$out/optin-gpu_test.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$out/optin-gpu_test.log" | tail -15
fi
if [[ $steps == *" bits "* ]]; then
  echo "=== same bits, default against ${on[*]}"
  NEW_ENV="${on[*]}" timeout 300 bash scripts/gpu-same-bits.sh "$GPU_BIN/epmoe" "$GPU_BIN/epmoe" \
    > "$out/optin-same-bits.log" 2>&1 || status=1
  tail -4 "$out/optin-same-bits.log"
  echo "=== same bits, default against EPMOE_NORM_SPLITS=2"
  NEW_ENV="EPMOE_NORM_SPLITS=2" timeout 300 bash scripts/gpu-same-bits.sh "$GPU_BIN/epmoe" "$GPU_BIN/epmoe" \
    > "$out/optin-same-bits-splits2.log" 2>&1 || status=1
  tail -4 "$out/optin-same-bits-splits2.log"
fi
bench() {  # bench LABEL ENV...
  local label=$1
  shift
  echo "=== bench $label"
  env "$@" timeout 200 "$GPU_BIN/gpu_model_bench" --layers 48 --batches 1,8,64 --prefill 0 \
    --out "$out/optin-bench.$label.tsv" > "$out/optin-bench.$label.log" 2>&1
  grep -E "^\| decode" "$out/optin-bench.$label.log"
}
if [[ $steps == *" bench "* ]]; then
  for round in $(seq 1 "${ROUNDS:-2}"); do
    bench "off$round"
    bench "on$round" "${on[@]}"
    bench "run22-three$round" EPMOE_RMSNORM_REGS=1 EPMOE_ATTN_EARLY_TILES=1 EPMOE_ROUTER_ROUTES=1
    bench "norm-splits$round" EPMOE_NORM_SPLITS=1
    bench "norm-splits2$round" EPMOE_NORM_SPLITS=2
  done
fi
exit $status
