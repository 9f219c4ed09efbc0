#!/usr/bin/env bash
# README's benchmark command: builds, synthesizes a 4-layer Qwen3-30B-A3B-shaped model (6.2 GB,
# once, under build/), then prints
#   - the MoE layer at Qwen3-30B-A3B shape against this machine's measured limits and OpenBLAS,
#     and decode / prefill tokens/s of the 4-layer model (bench/moe_bench.cc);
#   - the whole model: prefill 512 / 2048 and decode after 512 tokens, fp32 and bf16 compute, with
#     the read bandwidth before each figure and where each step's time goes (bench/model_bench.cc);
#     with LLAMA_BENCH=.../llama-bench and GGUF=<the same weights as a GGUF>, llama.cpp in the same
#     run, interleaved, and the ratios (../shared/anchors/llamacpp/README.md: building and converting);
#   - dispatch + combine of every a2a backend against a raw MPI_Alltoallv, R = 2 and 4
#     (bench/ep_bench.cc).
# Figures are printed, never asserted. Run it on a quiet machine: other load skews every number.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
model=build/synth-qwen3-30b-a3b-4l
if [[ ! -f $model/model.safetensors.index.json ]]; then
  build/epmoe synth --like qwen3-30b-a3b --layers 4 --out "$model"
fi
build/bench/moe_bench --model "$model"
echo
if [[ -n ${LLAMA_BENCH:-} ]]; then
  build/bench/model_bench --model "$model" --cycles 5 --stages --llama-bench "$LLAMA_BENCH" --gguf "${GGUF:?GGUF=the same weights as a GGUF}"
else
  build/bench/model_bench --model "$model" --cycles 3 --stages
fi
for ranks in 2 4; do
  echo
  mpirun --oversubscribe -np "$ranks" build/bench/ep_bench --tokens 16,256,4096
done
