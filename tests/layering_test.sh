#!/usr/bin/env bash
# Fails when code outside src/ep/ names an all-to-all backend or its implementation: the MoE
# layer and the models must not be able to branch on which backend runs (ARCHITECTURE.md).
set -u
src=${1:?usage: layering_test.sh SRC_DIR}
pattern='alltoall|lowlatency|onesided|AllToAll|LowLatency|OneSided|BackendKind|traits_of|make_(none|alltoall|lowlatency|onesided|fused)_backend'
# src/ep/ and the GPU backends (src/cuda/ep_*) are the only places that may.
hits=$(grep -rnwE "$pattern" "$src" --include='*.cc' --include='*.h' --include='*.cu' --include='*.cuh' |
       grep -v "^$src/ep/" | grep -v "^$src/cuda/ep_")
if [[ -n $hits ]]; then
  echo "code outside src/ep/ names a backend:"
  echo "$hits"
  exit 1
fi
# And no layer below ep/ may include it (comm, kernels, tensor, util, io).
for layer in comm kernels tensor util io; do
  inc=$(grep -rn '#include "ep/' "$src/$layer" 2>/dev/null)
  if [[ -n $inc ]]; then
    echo "src/$layer must not depend on src/ep:"
    echo "$inc"
    exit 1
  fi
done
echo "layering ok"
