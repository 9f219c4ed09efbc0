#!/usr/bin/env bash
# Builds the CUDA targets on this machine and gathers what a GPU machine needs into .gpu/ (listed
# in .gitignore): stripped binaries, and the shared libraries they use that such a machine
# lacks (OpenMPI, PCRE2, utf8proc and their dependencies; libc, libstdc++ and NCCL are found there).
#   bash scripts/gpu-package.sh          # then carry .gpu to the GPU machine and run scripts/gpu-test.sh
# TRACE=1 adds .gpu/trace/: gpu_model_bench and gpu_test from a second build (build-cuda-trace)
# configured with -DEPMOE_KERNEL_TRACE=ON, whose kernels stamp the kernel timeline (--trace 1).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-cuda}
jobs=${JOBS:-2}
# Tests on: the GPU test binaries are test targets (only those below are built).
# (One object per source, also where scripts/build-cuda.sh left a unity build in the same folder:
# a kernel edit then recompiles one file.)
PATH=/usr/local/cuda/bin:$PATH cmake -S . -B "$build" -DEPMOE_CUDA=ON -DEPMOE_BUILD_TESTS=ON \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=OFF >/dev/null
targets=(epmoe gpu_test gpu_ep_test gpu_ipc_test gpu_moe_bench gpu_ep_bench gpu_model_bench gpu_gemm_bench gpu_chain_bench mma_chain_bench scheduler_bench)
cmake --build "$build" -j"$jobs" --target "${targets[@]}"
rm -rf .gpu
mkdir -p .gpu/bin .gpu/lib
for t in "${targets[@]}"; do
  f=$(find "$build" -type f -name "$t" -perm -u+x | head -1)
  strip -o ".gpu/bin/$t" "$f"
done
cp bench/cuda/torch_moe_bench.py .gpu/bin/
if [[ ${TRACE:-0} == 1 ]]; then
  PATH=/usr/local/cuda/bin:$PATH cmake -S . -B "$build-trace" -DEPMOE_CUDA=ON -DEPMOE_BUILD_TESTS=ON \
    -DEPMOE_KERNEL_TRACE=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build-trace" -j"$jobs" --target gpu_model_bench gpu_test
  mkdir -p .gpu/trace
  for t in gpu_model_bench gpu_test; do
    strip -o ".gpu/trace/$t" "$(find "$build-trace" -type f -name "$t" -perm -u+x | head -1)"
  done
fi
ldd .gpu/bin/epmoe | awk '/=> \//{print $3}' |
  grep -vE '/lib(c|m|stdc\+\+|gcc_s|pthread|dl|rt|nccl)\.so' | while read -r lib; do cp -L "$lib" .gpu/lib/; done
du -sh .gpu
