// The SoftmaxTopK routing of one token by one warp with every score in registers (Qwen,
// Mixtral): route_softmax_kernel's body (routing.cu), and the router's last CTA's when it routes a
// decode step itself (router.cu, RouterGpu::run_and_route). Device code of those two sources only.
#pragma once

#include "moe/cuda/routing.cuh"
#include "util/hash.h"

namespace epmoe::cuda {

constexpr int kMaxRouterParts = 16;  // router_chunks() never returns more

// The replica of slot k of token t and the three outputs (one lane per slot).
static __device__ inline void write_slot(const RouteArgs& a, int64_t t, uint64_t gid, int k, int l, float w) {
  int phys = l;
  if (!a.identity) {
    const int r0 = a.rep_off[l], nr = a.rep_off[l + 1] - r0;
    // The replica hash of Placement::choose (util/hash.h): the same choice as on the CPU.
    phys = nr == 1 ? a.rep_list[r0] : a.rep_list[r0 + int(replica_index(gid, k, uint64_t(nr)))];
  }
  const int K = a.cfg.top_k;
  if (a.logical) a.logical[t * K + k] = l;
  a.physical[t * K + k] = phys;
  a.weights[t * K + k] = w;
}

// SoftmaxTopK (Qwen, Mixtral) with every score in registers: expert e = lane + 32 r lives in
// v[r] of `lane`. The same arithmetic in the same order as route_kernel (per-lane sums in
// ascending e, the same warp trees, the same ties), so the same bits; but no shared memory, every
// logit load issued before the first add, and no rescans of the chosen ids: at one token the
// kernel is a chain of a few hundred dependent instructions instead of several microseconds.
template <int R>
static __device__ inline void route_softmax_token(const RouteArgs& a, int64_t t, int lane) {
  const RoutingConfig& c = a.cfg;
  const int E = c.num_experts, K = c.top_k;
  const uint64_t gid = a.identity ? 0 : a.gids[t];
  float part[R][kMaxRouterParts];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int e = lane + 32 * r;
#pragma unroll
    for (int p = 0; p < kMaxRouterParts; p++)
      part[r][p] = p < a.parts && e < E ? a.logits[p * a.part_stride + t * E + e] : 0.f;
  }
  float v[R];
  float m = -INFINITY;
#pragma unroll
  for (int r = 0; r < R; r++) {
    float x = 0.f;
#pragma unroll
    for (int p = 0; p < kMaxRouterParts; p++)
      if (p < a.parts) x += part[r][p];
    v[r] = x;
    if (lane + 32 * r < E) m = fmaxf(m, x);
  }
  m = warp_max(m);
  float sum = 0.f;
#pragma unroll
  for (int r = 0; r < R; r++)
    if (lane + 32 * r < E) {
      v[r] = expf(v[r] - m);
      sum += v[r];
    }
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
#pragma unroll
  for (int r = 0; r < R; r++) v[r] *= inv;
  // Top-k: K rounds of (best untaken score of the lane, lowest e first) + warp argmax.
  uint32_t taken = 0;
  int my_id = -1;  // lane k < K: the k-th chosen expert and its probability
  float my_w = 0.f;
  for (int j = 0; j < K; j++) {
    float bv = -INFINITY;
    int bi = -1;
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int e = lane + 32 * r;
      if (e < E && !(taken >> r & 1u) && (bi < 0 || v[r] > bv)) bv = v[r], bi = e;
    }
    warp_argmax(bv, bi);
    if (bi >= 0 && (bi & 31) == lane) taken |= 1u << (bi >> 5);
    if (lane == j) my_id = bi, my_w = bv;
  }
  // The sum of the K weights in slot order, as lane 0 of route_kernel adds them.
  float wsum = 0.f;
  for (int k = 0; k < K; k++) wsum += __shfl_sync(0xffffffffu, my_w, k);
  if (c.norm_topk_prob) my_w /= wsum;
  if (lane < K) write_slot(a, t, gid, lane, my_id, my_w);
}

// SoftmaxTopK of one token by one block of 32 R threads, a thread per expert (route() at every
// step size unless EPMOE_ROUTE_BLOCK=0). Why not route_softmax_token's warp: Nsight Compute (run
// 27, one H100) found its one token ~1,750 instructions of one warp at ~7.5 cycles each, 8.9 us --
// 64 partial loads with their addresses in one lane, and K rounds of a dependent warp argmax. Here
// a thread loads and adds its own expert's 16 partials, and the top-k is a rank each thread counts
// against all E keys at once.
//
// The same bits and choices as route_softmax_token: each logit is the same in-order sum of its
// partials; the max is exact in any order; the softmax's sum is warp 0's per-lane sums over
// e = lane + 32 r in ascending r and the same warp tree; the chosen weights add in slot order. The
// top-k: the probabilities are >= +0 (never -0), so a float's bits order like its value, and
// key = (bits << 32) | ~e ranks by value, then lower e first -- K rounds of "best untaken, lowest e
// on ties" pick the same experts in the same order. A NaN has no such order (and the rounds' choice
// with one is their own), so a token with one is routed by route_softmax_token itself.
template <int R>
__global__ void __launch_bounds__(32 * R) route_softmax_block_kernel(const RouteArgs a) {
  constexpr int NT = 32 * R;
  __shared__ float val[NT];                                // exp(x - max) of expert e
  __shared__ __align__(16) unsigned long long key[NT];    // rank keys (0: no expert)
  __shared__ float red[R];                                 // per-warp maxima, then the sum
  __shared__ int chosen_id[32];
  __shared__ float chosen_w[32];
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const uint64_t gid = a.identity ? 0 : a.gids[t];  // (a step input, copied in before its kernels)
  pdl_wait();  // (PDL, common.cuh) before the first read of an earlier kernel's output
  const RoutingConfig& c = a.cfg;
  const int E = c.num_experts, K = c.top_k;
  const int e = threadIdx.x, lane = e & 31, warp = e >> 5;
  const bool expert = e < E;
  float part[kMaxRouterParts];
#pragma unroll
  for (int p = 0; p < kMaxRouterParts; p++)
    part[p] = p < a.parts && expert ? a.logits[p * a.part_stride + t * E + e] : 0.f;
  float x = 0.f;
#pragma unroll
  for (int p = 0; p < kMaxRouterParts; p++)
    if (p < a.parts) x += part[p];
  float m = warp_max(expert ? x : -INFINITY);
  if (lane == 0) red[warp] = m;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < R; w++) m = fmaxf(m, red[w]);
  const float ex = expert ? expf(x - m) : 0.f;
  val[e] = ex;
  __syncthreads();  // (also: every thread has read red)
  if (warp == 0) {
    float sum = 0.f;
#pragma unroll
    for (int r = 0; r < R; r++)
      if (lane + 32 * r < E) sum += val[lane + 32 * r];
    sum = warp_sum(sum);
    if (lane == 0) red[0] = sum;
  }
  __syncthreads();
  const float v = ex * (1.0f / red[0]);
  if (__syncthreads_or(expert && isnan(v))) {
    if (warp == 0) route_softmax_token<R>(a, t, lane);
    return;
  }
  const unsigned long long mine =
      expert ? (static_cast<unsigned long long>(__float_as_uint(v)) << 32) | ~static_cast<unsigned>(e) : 0ull;
  key[e] = mine;
  __syncthreads();
  int rank = 0;
  const ulonglong2* k2 = reinterpret_cast<const ulonglong2*>(key);
#pragma unroll 8
  for (int j = 0; j < NT / 2; j++) {
    const ulonglong2 q = k2[j];
    rank += (q.x > mine) + (q.y > mine);
  }
  if (expert && rank < K) chosen_id[rank] = e, chosen_w[rank] = v;
  __syncthreads();
  if (warp != 0) return;
  float wsum = 0.f;  // in slot order, as route_softmax_token's lanes add them
  for (int k = 0; k < K; k++) wsum += chosen_w[k];
  if (lane < K) {
    float w = chosen_w[lane];
    if (c.norm_topk_prob) w /= wsum;
    write_slot(a, t, gid, lane, chosen_id[lane], w);
  }
}

}  // namespace epmoe::cuda
