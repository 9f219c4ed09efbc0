#!/usr/bin/env bash
# The decode-chain kernel paths and their switches (issue 33), on one GPU from .gpu/
# (scripts/gpu-package.sh):
#   EPMOE_RMSNORM_REGS=0      RMSNorm on the loop kernel instead of the row in registers (default since run 23)
#   EPMOE_ATTN_EARLY_TILES=0  decode attention requests no earlier K/V tiles before its wait (default since run 23)
#   EPMOE_NORM_SPLITS=0       the projections split their x themselves (default since run 23: the norm and
#                             attention write split_gemv's fragments)
#   EPMOE_ROUTER_ROUTES=1     decode steps routed by the router's last CTA (opt-in: slower at 8 sequences)
# Every GPU test with the opt-in path on; scripts/gpu-same-bits.sh of the binary against itself with
# the defaults' switches off and with the opt-in on (every fixture's logits and two greedy rollouts
# must be the same bytes); then the 48-layer decode bench at 1 / 8 / 64 sequences alternating the
# default, each default switched off, and the opt-in on. A path whose tests and bits pass and whose
# bench rows win becomes (or stays) the default. Logs under OUT. Exit status 0 when the tests and bits pass.
# STEPS (default "tests bits bench") picks the parts; ROUNDS (2) the bench's rounds.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
out=${OUT:-/tmp/epmoe-gpu}
mkdir -p "$out"
off=(EPMOE_RMSNORM_REGS=0 EPMOE_ATTN_EARLY_TILES=0 EPMOE_NORM_SPLITS=0)
steps=" ${STEPS:-tests bits bench} "
status=0
if [[ $steps == *" tests "* ]]; then
  echo "=== gpu_test with EPMOE_ROUTER_ROUTES=1"
  EPMOE_ROUTER_ROUTES=1 timeout 300 "$GPU_BIN/gpu_test" --gtest_color=no > "$out/optin-gpu_test.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$out/optin-gpu_test.log" | tail -15
fi
same_bits() {  # same_bits LABEL ENV...: the default against the binary with ENV
  local label=$1
  shift
  echo "=== same bits, default against $*"
  NEW_ENV="$*" timeout 300 bash scripts/gpu-same-bits.sh "$GPU_BIN/epmoe" "$GPU_BIN/epmoe" \
    > "$out/optin-same-bits.$label.log" 2>&1 || status=1
  tail -3 "$out/optin-same-bits.$label.log"
}
if [[ $steps == *" bits "* ]]; then
  same_bits defaults-off "${off[@]}"
  same_bits router-routes EPMOE_ROUTER_ROUTES=1
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
    bench "default$round"
    bench "all-off$round" "${off[@]}"
    for sw in "${off[@]}"; do bench "${sw%=0}-off$round" "$sw"; done
    bench "router-routes$round" EPMOE_ROUTER_ROUTES=1
  done
fi
exit $status
