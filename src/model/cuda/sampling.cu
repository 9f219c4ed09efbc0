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
                                                             int32_t* tokens, float* logprobs, float* norm) {
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
    if (norm) norm[2 * blockIdx.x] = m, norm[2 * blockIdx.x + 1] = lse;
  }
}

// The stable order of RowLogprobs::top: logit descending, id ascending; an empty slot (id -1)
// after every id (-inf logits included). warp_argmax (common.cuh) picks by the same order.
__device__ inline bool before(float av, int ai, float bv, int bi) {
  return ai >= 0 && (bi < 0 || av > bv || (av == bv && ai < bi));
}

// One block of kTopThreads per draw (1024, as draw_kernel: the row's ~150k loads are then ~37
// rounds of four per thread; K = 20 still fits the 64 registers without a spill). Each thread
// keeps the first K of its strided slice in the stable order, sorted, in registers (K a
// compile-time bound: every index below is unrolled); then top_n rounds of a block-wide pick of
// the best head, whose thread pops it. Any id of the row's first top_n is among the first K of
// its own thread's slice, so the rounds find them all.
// The log-prob is (l / T - max) - lse, RowLogprobs::at's operations, with draw_kernel's max and
// lse (the host's bits: kernels/sampling_math.h's fixed order).
constexpr int kTopThreads = 1024;
static_assert(kTopThreads % 32 == 0 && kTopThreads <= 1024, "whole warps, one block");
template <int K>
__global__ void __launch_bounds__(kTopThreads) top_kernel(const float* logits, int V, const DrawSpec* specs,
                                                          const float* norm, int stride, int32_t* ids,
                                                          float* logprobs) {
  __shared__ float sv[kTopThreads / 32];
  __shared__ int si[kTopThreads / 32];
  __shared__ float best_v;
  __shared__ int best_i;
  pdl_wait();  // draw_kernel's norm (launched with launch_pdl)
  pdl_trigger();
  const DrawSpec d = specs[blockIdx.x];
  if (d.top_n <= 0) return;  // (the whole block)
  const float* x = logits + int64_t(d.row) * V;
  const int j = threadIdx.x, lane = j & 31, warp = j >> 5;
  float tv[K];
  int ti[K];
#pragma unroll
  for (int k = 0; k < K; k++) tv[k] = -INFINITY, ti[k] = -1;
  // Insertion into the sorted list, unrolled: the candidate bubbles down from the slot it beats.
  auto insert = [&](float v, int i) {
    if (!before(v, i, tv[K - 1], ti[K - 1])) return;  // most ids stop here
#pragma unroll
    for (int k = 0; k < K; k++)
      if (before(v, i, tv[k], ti[k])) {
        const float ov = tv[k];
        const int oi = ti[k];
        tv[k] = v, ti[k] = i;
        v = ov, i = oi;
      }
  };
  int i = j;
  for (; i + 3 * kTopThreads < V; i += 4 * kTopThreads) {  // four loads in flight
    float v[4];
#pragma unroll
    for (int u = 0; u < 4; u++) v[u] = x[i + u * kTopThreads];
#pragma unroll
    for (int u = 0; u < 4; u++) insert(v[u], i + u * kTopThreads);
  }
  for (; i < V; i += kTopThreads) insert(x[i], i);
  const float T = d.temperature > 0.0f ? d.temperature : 1.0f;
  const float m = norm[2 * blockIdx.x], lse = norm[2 * blockIdx.x + 1];
  for (int r = 0; r < d.top_n; r++) {
    float bv = tv[0];
    int bi = ti[0];
    warp_argmax(bv, bi);  // every lane: its warp's best head
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (warp == 0) {
      bv = lane < kTopThreads / 32 ? sv[lane] : -INFINITY;
      bi = lane < kTopThreads / 32 ? si[lane] : -1;
      warp_argmax(bv, bi);
      if (lane == 0) best_v = bv, best_i = bi;
    }
    __syncthreads();
    // (Every thread reads best_ before the next round's first barrier, after which warp 0 writes
    // them again; sv, si are read by warp 0 before this round's second barrier.)
    bv = best_v, bi = best_i;
    if (bi >= 0 && ti[0] == bi) {  // an id lives in one thread's slice only: its thread pops it
#pragma unroll
      for (int k = 0; k + 1 < K; k++) tv[k] = tv[k + 1], ti[k] = ti[k + 1];
      tv[K - 1] = -INFINITY, ti[K - 1] = -1;
    }
    if (j == 0) {
      ids[int64_t(blockIdx.x) * stride + r] = bi;
      logprobs[int64_t(blockIdx.x) * stride + r] = bi >= 0 ? __fsub_rn(__fsub_rn(__fdiv_rn(bv, T), m), lse) : 0.0f;
    }
  }
}

}  // namespace

void draw_rows(const float* logits, int V, const DrawSpec* specs, int n, int32_t* tokens, float* logprobs,
               cudaStream_t s, float* norm) {
  if (n == 0) return;
  launch_pdl(draw_kernel, dim3(unsigned(n)), dim3(kLogprobLanes), 0, s, logits, V, specs, tokens, logprobs, norm);
  EPMOE_CUDA_LAUNCHED();
}

void top_rows(const float* logits, int V, const DrawSpec* specs, int n, const float* norm, int stride, int32_t* ids,
              float* logprobs, cudaStream_t s) {
  EPMOE_ASSERT(stride >= 1 && stride <= kMaxTopRows,
               "top_rows: " + std::to_string(stride) + " alternatives a draw, outside [1, " +
                   std::to_string(kMaxTopRows) + "]");
  if (n == 0) return;
  // The smallest list that holds the stride (serve_bench's logprobs: 1 keeps one register pair).
  auto launch = [&](auto kernel) {
    launch_pdl(kernel, dim3(unsigned(n)), dim3(kTopThreads), 0, s, logits, V, specs, norm, stride, ids, logprobs);
  };
  if (stride <= 1) launch(top_kernel<1>);
  else if (stride <= 5) launch(top_kernel<5>);
  else launch(top_kernel<kMaxTopRows>);
  EPMOE_CUDA_LAUNCHED();
}

void argmax_rows(const float* logits, int64_t R, int V, int32_t* out, cudaStream_t s) {
  if (R == 0) return;
  launch_pdl(argmax_kernel, dim3(unsigned(R)), dim3(1024), 0, s, logits, V, out);
  EPMOE_CUDA_LAUNCHED();
}

}  // namespace epmoe::cuda
