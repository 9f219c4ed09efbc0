// Token choice on the GPU: the greedy argmax of model.cc (language_model.h argmax), on the device,
// so that a decode step downloads one id per sequence instead of its logits.
#pragma once

#include "kernels/cuda/common.cuh"

namespace epmoe::cuda {

// Greedy decoding on the device: out[r] = index of the largest of logits[r, 0..V) (ties to the
// lower index, as argmax of model/language_model.h).
void argmax_rows(const float* logits, int64_t R, int V, int32_t* out, cudaStream_t s);

}  // namespace epmoe::cuda
