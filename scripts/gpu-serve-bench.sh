#!/usr/bin/env bash
# On a GPU machine (after scripts/gpu-package.sh, with .gpu carried): `epmoe serve --device cuda`
# on the synthesized 4-layer Qwen3-30B-A3B (bf16, the real tokenizer) under bench/serve_bench.py's
# closed-loop load at concurrency 1, 8, 32, 128 with the identical column, then the scheduler's
# cost against the fixed-batch forward (bench/scheduler_bench; SCHEDULER_BENCH=0 skips it). Results
# under OUT (default out/).
#   OUT=/path bash scripts/gpu-serve-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
out=${OUT:-out}
mkdir -p "$out"
model=${MODEL:-/tmp/epmoe-synth4}
if [[ ! -f $model/model.safetensors.index.json ]]; then
  "$GPU_BIN/epmoe" synth --like qwen3-30b-a3b --layers 4 --dtype bf16 --out "$model" >/dev/null
fi
cp tests/data/tokenizers/qwen2/{vocab.json,merges.txt,tokenizer.json,tokenizer_config.json} "$model/"
python=${PYTHON:-python3}
"$python" -c 'import aiohttp' 2>/dev/null || { echo "gpu-serve-bench: $python has no aiohttp" >&2; exit 2; }

"$GPU_BIN/epmoe" serve --model "$model" --device cuda --port 0 ${SERVE_ARGS:-} >"$out/serve.log" 2>&1 &
server=$!
for _ in $(seq 600); do grep -q "listening on" "$out/serve.log" && break; sleep 0.5; done
url=$(grep -o "http://[0-9.]*:[0-9]*" "$out/serve.log" | head -1)
[[ -n $url ]] || { cat "$out/serve.log"; exit 1; }
"$python" bench/serve_bench.py run --url "$url" --label epmoe-h200 --levels "${LEVELS:-1,8,32,128}" \
  --check-alone "${CHECK_ALONE:-8}" --max-tokens "${MAX_TOKENS:-32}" --deadline "${DEADLINE:-420}" \
  --out "$out/serve-h200.json" > "$out/serve-h200.txt" 2>&1 || true
kill -TERM "$server"
wait "$server" || true
"$python" bench/serve_bench.py table "$out/serve-h200.json" > "$out/serve-h200.md" 2>&1 || true
if [[ ${SCHEDULER_BENCH:-1} != 0 && -x $GPU_BIN/scheduler_bench ]]; then
  timeout 200 "$GPU_BIN/scheduler_bench" --device cuda > "$out/scheduler-h200.txt" 2>&1 || true
fi
