#include "model/cuda/sampling.cuh"

#include "kernels/sampling_math.h"

namespace epmoe::cuda {

namespace {

// The first maximum of x[j], x[j + step], ... (ascending ids: ties keep the lower id), four loads
// in flight per round: a 150k-entry vocabulary row is ~40 dependent rounds per thread instead of
// ~150 (or ~600 at 256 threads), each a trip to L2.
__device__ inline void lane_argmax(const float* x, int V, int j, int step, float& bv, int& bi) {
  int i = j;
  for (; i + 3 * step < V; i += 4 * step) {
    float v[4];
#pragma unroll
    for (int u = 0; u < 4; u++) v[u] = x[i + u * step];
#pragma unroll
    for (int u = 0; u < 4; u++)
      if (bi < 0 || v[u] > bv) bv = v[u], bi = i + u * step;
  }
  for (; i < V; i += step)
    if (bi < 0 || x[i] > bv) bv = x[i], bi = i;
}

// The block's first maximum (ties to the lower id) of every thread's candidate, to every thread.
// sv, si: 32 entries of shared memory.
__device__ inline int block_argmax(float bv, int bi, float* sv, int* si) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = int(blockDim.x >> 5);
  warp_argmax(bv, bi);
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    bv = lane < nw ? sv[lane] : -INFINITY;
    bi = lane < nw ? si[lane] : -1;
    warp_argmax(bv, bi);  // (every lane has read si[] before lane 0 writes si[0])
    if (lane == 0) si[0] = bi;
  }
  __syncthreads();
  return si[0];
}

__global__ void argmax_kernel(const float* logits, int V, int32_t* out) {
  __shared__ float sv[32];
  __shared__ int si[32];
  pdl_wait();  // (launched with launch_pdl)
  pdl_trigger();
  const float* x = logits + int64_t(blockIdx.x) * V;
  float bv = -INFINITY;
  int bi = -1;
  lane_argmax(x, V, int(threadIdx.x), int(blockDim.x), bv, bi);
  const int best = block_argmax(bv, bi, sv, si);
  if (threadIdx.x == 0) out[blockIdx.x] = best;
}

// One block of kLogprobLanes threads per draw; thread j is lane j of the fixed summation order.
__global__ void __launch_bounds__(kLogprobLanes) draw_kernel(const float* logits, int V, const DrawSpec* specs,
                                                             int32_t* tokens, float* logprobs) {
  __shared__ float lane[kLogprobLanes];
  __shared__ float sv[32];
  __shared__ int si[32];
  __shared__ double sk[32];
  pdl_wait();  // (launched with launch_pdl)
  pdl_trigger();
  const DrawSpec d = specs[blockIdx.x];
  const float* x = logits + int64_t(d.row) * V;
  const int j = threadIdx.x, w32 = j & 31, warp = j >> 5, nw = kLogprobLanes / 32;
  const float T = d.temperature > 0.0f ? d.temperature : 1.0f;
  // The greedy id (ties to the lower id) and max(l / T): both independent of the order.
  float bv = -INFINITY;
  int bi = -1;
  lane_argmax(x, V, j, kLogprobLanes, bv, bi);
  const int greedy = block_argmax(bv, bi, sv, si);
  const float m = __fdiv_rn(x[greedy], T);  // the largest l / T (division by T > 0 is monotone)
  // Lane j: ids j, j + lanes, ... ascending; then the pairwise tree.
  // (Four loads in flight, then the four terms in id order: the same sum.)
  float acc = 0.0f;
  int i = j;
  for (; i + 3 * kLogprobLanes < V; i += 4 * kLogprobLanes) {
    float v[4];
#pragma unroll
    for (int u = 0; u < 4; u++) v[u] = x[i + u * kLogprobLanes];
#pragma unroll
    for (int u = 0; u < 4; u++) acc = __fadd_rn(acc, det_expf(__fsub_rn(__fdiv_rn(v[u], T), m)));
  }
  for (; i < V; i += kLogprobLanes) acc = __fadd_rn(acc, det_expf(__fsub_rn(__fdiv_rn(x[i], T), m)));
  lane[j] = acc;
  __syncthreads();
  for (int w = kLogprobLanes / 2; w > 0; w /= 2) {
    if (j < w) lane[j] = __fadd_rn(lane[j], lane[j + w]);
    __syncthreads();
  }
  const float lse = det_logf(lane[0]);
  int token = greedy;
  if (d.temperature > 0.0f) {
    // The exponential race: argmin of race_key over every id, ties to the lower id.
    const double Td = double(d.temperature), md = double(x[greedy]) / Td;
    double bk = INFINITY;
    int bid = -1;
    for (int i = j; i < V; i += kLogprobLanes) {
      const double k = race_key(sampling_uniform_of(d.seed, d.position, i), x[i], Td, md);
      if (bid < 0 || k < bk) bk = k, bid = i;  // ascending within the lane: ties to the lower id
    }
    for (int o = 16; o > 0; o >>= 1) {
      const double ok = __shfl_down_sync(0xffffffffu, bk, o);
      const int oi = __shfl_down_sync(0xffffffffu, bid, o);
      if (oi >= 0 && (bid < 0 || ok < bk || (ok == bk && oi < bid))) bk = ok, bid = oi;
    }
    __syncthreads();
    if (w32 == 0) sk[warp] = bk, si[warp] = bid;
    __syncthreads();
    if (warp == 0) {
      bk = w32 < nw ? sk[w32] : INFINITY;
      bid = w32 < nw ? si[w32] : -1;
      for (int o = 16; o > 0; o >>= 1) {
        const double ok = __shfl_down_sync(0xffffffffu, bk, o);
        const int oi = __shfl_down_sync(0xffffffffu, bid, o);
        if (oi >= 0 && (bid < 0 || ok < bk || (ok == bk && oi < bid))) bk = ok, bid = oi;
      }
      if (w32 == 0) si[0] = bid;
    }
    __syncthreads();
    token = si[0];
  }
  if (j == 0) {
    tokens[blockIdx.x] = token;
    logprobs[blockIdx.x] = __fsub_rn(__fsub_rn(__fdiv_rn(x[token], T), m), lse);
  }
}

}  // namespace

void draw_rows(const float* logits, int V, const DrawSpec* specs, int n, int32_t* tokens, float* logprobs,
               cudaStream_t s) {
  if (n == 0) return;
  launch_pdl(draw_kernel, dim3(unsigned(n)), dim3(kLogprobLanes), 0, s, logits, V, specs, tokens, logprobs);
  EPMOE_CUDA_LAUNCHED();
}

void argmax_rows(const float* logits, int64_t R, int V, int32_t* out, cudaStream_t s) {
  if (R == 0) return;
  launch_pdl(argmax_kernel, dim3(unsigned(R)), dim3(1024), 0, s, logits, V, out);
  EPMOE_CUDA_LAUNCHED();
}

}  // namespace epmoe::cuda
