#!/usr/bin/env bash
# The real model's depth on one GPU (issue 33), from .gpu/ (scripts/gpu-package.sh):
#   1. a 48-layer Qwen3-30B-A3B bf16 checkpoint (56.9 GiB) written by `epmoe synth` into /dev/shm
#      when it has room (then every later read is from the page cache), else into $DIR (default /tmp);
#   2. its load time: `epmoe generate --device cuda --max-new-tokens 1` wall time, twice (the loader's
#      own line on stderr gives GB and GB/s);
#   3. a cold load from the disk: an 8-layer checkpoint written to $DIR, the page cache dropped, the
#      same call, beside the disk's own read rate (dd of the same shards, the cache dropped again);
#   4. `epmoe serve --device cuda` on the 48-layer checkpoint at concurrency 1/8/32/128
#      (scripts/gpu-serve-bench.sh).
# STEPS (default "synth load cold serve") picks the parts. Logs and tables under OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
out=${OUT:-/tmp/epmoe-gpu}
dir=${DIR:-/tmp}
mkdir -p "$out"
steps=" ${STEPS:-synth load cold serve} "
model=${MODEL:-}
if [[ -z $model ]]; then
  shm=$(df --output=avail -B1 /dev/shm 2>/dev/null | tail -1)
  if [[ -n $shm ]] && ((shm > 62 * 1000 * 1000 * 1000)); then model=/dev/shm/q30-48; else model=$dir/q30-48; fi
fi
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$@"; }
load_once() {  # load_once MODEL LABEL
  local t0 t1
  t0=$(date +%s.%N)
  timeout 400 "$GPU_BIN/epmoe" generate --device cuda --model "$1" --prompt-ids 1,2,3 --max-new-tokens 1 \
    > "$out/load.log" 2>&1
  local rc=$?
  t1=$(date +%s.%N)
  echo "$2: generate --max-new-tokens 1 took $(secs "$t0" "$t1") s (exit $rc); loader: $(grep -a 'weights to GPU' "$out/load.log" | tail -1 | tr '\r' '\n' | tail -1)"
}
if [[ $steps == *" synth "* && ! -f $model/model.safetensors.index.json ]]; then
  t0=$(date +%s.%N)
  "$GPU_BIN/epmoe" synth --like qwen3-30b-a3b --dtype bf16 --out "$model" 2> "$out/synth.err" | tail -1
  echo "synth of 48 layers: $(secs "$t0" "$(date +%s.%N)") s into $model"
fi
if [[ $steps == *" load "* ]]; then
  du -sh "$model"
  load_once "$model" "48 layers, page cache (1)"
  load_once "$model" "48 layers, page cache (2)"
fi
if [[ $steps == *" cold "* ]]; then
  cold=$dir/q30-8
  [[ -f $cold/model.safetensors.index.json ]] ||
    "$GPU_BIN/epmoe" synth --like qwen3-30b-a3b --layers 8 --dtype bf16 --out "$cold" 2>/dev/null | tail -1
  sync
  if echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
    load_once "$cold" "8 layers, cold from $dir"
    echo 3 > /proc/sys/vm/drop_caches
    t0=$(date +%s.%N)
    bytes=$(cat "$cold"/*.safetensors | wc -c)
    echo "disk read rate (cat of the same shards, cache dropped): $(python3 -c "import sys; print(f'{int(sys.argv[1]) / 1e9 / (float(sys.argv[3]) - float(sys.argv[2])):.2f}')" "$bytes" "$t0" "$(date +%s.%N)") GB/s"
  else
    echo "cold load: cannot drop the page cache here (not root?)"
  fi
  rm -rf "$cold"
fi
if [[ $steps == *" serve "* ]]; then
  MODEL=$model OUT=$out bash scripts/gpu-serve-bench.sh
  cat "$out/serve-h200.md"
fi
