#!/usr/bin/env bash
# Compiles the GPU path (src/cuda, sm_90a, with NCCL) when nvcc is present: CI has nvcc but no
# GPU, so it proves the CUDA code builds; running it needs the GPU machine (docs/gpu.md,
# scripts/gpu-test.sh). Only the epmoe_cuda library is built, to keep CI short.
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=$(command -v nvcc || true)
[[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
if [[ -z $nvcc ]]; then
  echo "build-cuda: no nvcc on this machine; the GPU path is not compiled" >&2
  exit 0
fi
bash scripts/install-deps.sh
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DEPMOE_CUDA=ON -DEPMOE_BUILD_TESTS=OFF -DEPMOE_BUILD_BENCH=OFF \
  -DCMAKE_CUDA_COMPILER="$nvcc" >/dev/null
cmake --build build-cuda -j"$(nproc)" --target epmoe_cuda
echo "build-cuda: src/cuda compiled for sm_90a"
