#!/usr/bin/env bash
# Do two epmoe binaries compute the same bits on the GPU? Every fixture of tests/data, in bf16 and
# f32 compute: `epmoe score --device cuda` (DEVICE=cpu: cpu) writes the logits of a 40-token sequence; the two
# files must be byte for byte equal. Then `epmoe generate` (greedy, the device argmax) on two
# fixtures must print the same tokens. For kernel work that claims to keep the bits (docs/gpu.md,
# issue 18): run the binary from before the change against the one after, on one GPU.
#   scripts/gpu-same-bits.sh OLD/epmoe NEW/epmoe        exit 0 when everything is identical; the last
#                                                       line is the verdict with every count
# DEVICE=cpu runs the same comparison on the CPU (for refactors that claim to keep the CPU's bits).
# NEW_ARGS: flags for the new binary only, where a change of default is the only difference meant
# (e.g. NEW_ARGS="--kv-cache-dtype fp32" after the GPU's KV cache became bf16 for bf16 models).
# NEW_ENV: environment assignments for the new binary only, e.g. NEW_ENV="EPMOE_RMSNORM_REGS=1": the
# same binary twice then compares an opt-in kernel path with the default one.
set -uo pipefail
cd "$(dirname "$0")/.."
[[ $# -eq 2 ]] || { echo "usage: scripts/gpu-same-bits.sh OLD_EPMOE NEW_EPMOE" >&2; exit 2; }
old=$1 new=$2
device=${DEVICE:-cuda}
[[ $device == cuda ]] && source scripts/gpu-env.sh
ids=3,17,5,9,22,31,4,8,15,2,11,27,6,13,19,1,25,7,30,12,9,9,14,3,28,16,21,10,24,5,18,29,2,26,20,23,11,4,7,1
tmp=$(mktemp -d)
same=0 differ=0 failed=0
for cfg in tests/data/*/config.json; do
  dir=$(dirname "$cfg") name=$(basename "$(dirname "$cfg")")
  for compute in bf16 f32; do
    for side in old new; do
      bin=$old extra="" envs=""; [[ $side == new ]] && bin=$new extra=${NEW_ARGS:-} envs=${NEW_ENV:-}
      if ! env $envs timeout 120 "$bin" score --device $device --compute $compute --model "$dir" --ids $ids $extra \
          --out "$tmp/$side.$name.$compute.safetensors" > "$tmp/$side.log" 2>&1; then
        echo "$name $compute: the $side binary failed: $(tail -1 "$tmp/$side.log")"
        failed=$((failed + 1))
        continue 2
      fi
    done
    if cmp -s "$tmp/old.$name.$compute.safetensors" "$tmp/new.$name.$compute.safetensors"; then
      same=$((same + 1))
    else
      differ=$((differ + 1))
      echo "DIFFERENT: $name --compute $compute"
    fi
  done
done
gen_same=0 gen_differ=0
for name in qwen3moe-tiny deepseek-v3-tiny; do
  # (A run that fails, or prints nothing, is a failure: two empty outputs must not read as the same tokens.)
  for side in old new; do
    bin=$old extra="" envs=""; [[ $side == new ]] && bin=$new extra=${NEW_ARGS:-} envs=${NEW_ENV:-}
    if ! env $envs timeout 120 "$bin" generate --device $device --model tests/data/$name --prompt-ids 3,17,5,9 \
        --max-new-tokens 24 $extra 2> "$tmp/gen.$side.log" | tail -2 > "$tmp/gen.$side" || [[ ! -s $tmp/gen.$side ]]; then
      echo "generate $name: the $side binary failed: $(tail -1 "$tmp/gen.$side.log")"
      failed=$((failed + 1))
      continue 2
    fi
  done
  if cmp -s "$tmp/gen.old" "$tmp/gen.new"; then echo "generate $name: same tokens"; gen_same=$((gen_same + 1))
  else echo "generate $name: DIFFERENT"; gen_differ=$((gen_differ + 1)); fi
done
rm -rf "$tmp"
# The verdict last, in one line: a caller that keeps only the tail of the output still has it.
verdict=SAME; ((differ + gen_differ + failed > 0)) && verdict=DIFFERENT
echo "same-bits $verdict: logits files identical $same, different $differ; generate same $gen_same, different $gen_differ; failed runs $failed"
((differ == 0 && gen_differ == 0 && failed == 0))
