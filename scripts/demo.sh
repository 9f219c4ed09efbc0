#!/usr/bin/env bash
# README's demo: install, build, then run the bundled tiny Qwen3-MoE with expert parallelism
# over 4 MPI ranks (each rank holds 2 of the 8 experts), with every backend, and show that the
# generated ids are the same as the single-process run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
model=tests/data/qwen3moe-tiny
prompts=tests/data/demo-prompts.txt
ranks=${RANKS:-4}

echo "== epmoe info"
build/epmoe info --model "$model"
echo
echo "== single process"
build/epmoe generate --model "$model" --prompts-file "$prompts" --max-new-tokens 12 | tee /tmp/epmoe-demo-ref.txt
for backend in none alltoall lowlatency onesided fused; do
  echo
  echo "== mpirun -np $ranks, --moe-a2a-backend $backend"
  mpirun --oversubscribe -np "$ranks" build/epmoe generate --model "$model" --prompts-file "$prompts" \
    --max-new-tokens 12 --moe-a2a-backend "$backend" | tee /tmp/epmoe-demo-$backend.txt
  if cmp -s /tmp/epmoe-demo-ref.txt /tmp/epmoe-demo-$backend.txt; then
    echo "   -> identical to the single-process run"
  else
    echo "   -> DIFFERENT from the single-process run"
    exit 1
  fi
done

# The server as a user meets it: a tiny random model that carries a tokenizer (text in, text out;
# the text is gibberish, the weights being random), served over HTTP on 2 MPI ranks, answering the
# OpenAI SDK and an sglang-style /generate call with log-probs.
echo
echo "== epmoe serve (2 ranks, alltoall), answering the OpenAI SDK and sglang's /generate"
text_model=/tmp/epmoe-demo-text-model
if [[ ! -f $text_model/tokenizer.json ]]; then
  /usr/bin/python3 - "$model/config.json" /tmp/epmoe-demo-text-config.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["vocab_size"] = 3000; c["eos_token_id"] = 2  # the fixture tokenizer's
json.dump(c, open(sys.argv[2], "w"))
PY
  build/epmoe synth --like /tmp/epmoe-demo-text-config.json --dtype f32 --out "$text_model" >/dev/null
  cp tests/data/bpe-tokenizer/tokenizer.json "$text_model/"
fi
log=/tmp/epmoe-demo-serve.log
mpirun --oversubscribe -np 2 build/epmoe serve --model "$text_model" --port 0 --moe-a2a-backend alltoall \
  --threads 1 >"$log" 2>&1 &
server=$!
for _ in $(seq 100); do grep -q "listening on" "$log" && break; sleep 0.2; done
url=$(grep -o "http://[0-9.]*:[0-9]*" "$log" | head -1)
cat "$log"
node scripts/demo-serve-client.mjs "$url"
echo "POST $url/generate (sglang's shape, as RL frameworks call it):"
curl -s "$url/generate" -H 'Content-Type: application/json' \
  -d '{"text": "Once upon a time", "sampling_params": {"max_new_tokens": 5, "temperature": 0.7, "sampling_seed": 1}, "return_logprob": true}'
echo
rank0=$(pgrep -P "$server" -f "epmoe serve" | head -1)
kill -TERM "${rank0:-$server}"
wait "$server" || true
tail -1 "$log"
