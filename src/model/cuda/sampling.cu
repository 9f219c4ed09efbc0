#include "model/cuda/sampling.cuh"

namespace epmoe::cuda {

namespace {

__global__ void argmax_kernel(const float* logits, int V, int32_t* out) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const float* x = logits + int64_t(blockIdx.x) * V;
  float bv = -INFINITY;
  int bi = -1;
  for (int i = threadIdx.x; i < V; i += blockDim.x)
    if (bi < 0 || x[i] > bv) bv = x[i], bi = i;
  warp_argmax(bv, bi);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    bv = lane < int(blockDim.x >> 5) ? sv[lane] : -INFINITY;
    bi = lane < int(blockDim.x >> 5) ? si[lane] : -1;
    warp_argmax(bv, bi);
    if (lane == 0) out[blockIdx.x] = bi;
  }
}

}  // namespace

void argmax_rows(const float* logits, int64_t R, int V, int32_t* out, cudaStream_t s) {
  if (R == 0) return;
  argmax_kernel<<<unsigned(R), 256, 0, s>>>(logits, V, out);
  EPMOE_CUDA_LAUNCHED();
}

}  // namespace epmoe::cuda
