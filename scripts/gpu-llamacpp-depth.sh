#!/usr/bin/env bash
# llama.cpp CUDA on a random bf16 GGUF with Qwen3-30B-A3B's real 48 layers (the anchor's
# gen_synth_gguf.py), the calls of ../shared/anchors/llamacpp_cuda/run_gpu.sh at full depth.
# EPMOE_BENCH=PATH/gpu_model_bench: epmoe's 48-layer table too, in the same call, alternating
# (epmoe, llama-bench, epmoe, llama-batched-bench), so both sides see the same machine (run 21).
# QUICK=1: llama-bench -r 2 and the batched bench once (npl 1,8,64,256), so that both sides fit one
# ten-minute device call (run 25).
set -u
reps=3 npl=1,8,64,256,1,8,64,256
[[ ${QUICK:-0} == 1 ]] && reps=2 npl=1,8,64,256
T=${LC_CARRY:-.gpu-lc}  # payload.tar.xz + anchors/{llamacpp,llamacpp_cuda} copied from ../shared (shared/anchors/llamacpp_cuda/README.md builds the payload)
OUT=${OUT:-/tmp/lcc-out}; mkdir -p "$OUT"
W=/tmp/lcc; mkdir -p $W
tar -xJf $T/payload.tar.xz -C $W || echo "payload unpack failed"
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
LIBS=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:/usr/local/nvidia/lib
for d in "$SP"/nvidia/*/lib "$SP"/nvidia/cu13/lib; do [ -d "$d" ] && LIBS=$LIBS:$d; done
export LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
M=${M:-/dev/shm/synth48-bf16.gguf}
t0=$(date +%s)
python3 $T/anchors/llamacpp_cuda/gen_synth_gguf.py $M --gguf-py $W/gguf-py --tokenizer ${TOKENIZER:-tests/data/tokenizers/qwen2} --layers ${LAYERS:-48} > $OUT/lc-gen.log 2>&1
echo "llama.cpp gguf gen: $(( $(date +%s) - t0 )) s, $(ls -la $M | awk '{print $5}') bytes"
B=$W/bin
epmoe_round() {  # epmoe_round N: gpu_model_bench's graph-on rows and prefill rows
  [[ -n ${EPMOE_BENCH:-} ]] || return 0
  echo "== epmoe gpu_model_bench, round $1"
  timeout 120 "$EPMOE_BENCH" > "$OUT/epmoe-$1.txt" 2>&1
  grep -E '^\| (prefill|decode) .*\| (on|-) \|' "$OUT/epmoe-$1.txt"
}
epmoe_round 1
echo "== llama-bench (prefill 512/2048, decode 128 at 1 sequence; flash attention on)"
timeout 200 $B/llama-bench -m $M -ngl 99 -p 512,2048 -n 128 -b 2048 -ub 512 -fa 1 -r $reps -o md 2>&1 | grep -E "^\|" | tee "$OUT/lc-bench.md"
epmoe_round 2
echo "== llama-batched-bench fa on, npp 128 ntg 32, npl $npl"
timeout 220 $B/llama-batched-bench -m $M -ngl 99 -c 65536 -b 2048 -ub 512 -fa on -npp 128 -ntg 32 \
  -npl $npl > "$OUT/lc-batched.log" 2>&1
grep -E "^\|" "$OUT/lc-batched.log"
rm -f $M
