// The SoftmaxTopK routing of one token by one warp with every score in registers (Qwen,
// Mixtral): route_softmax_kernel's body (routing.cu), and the router's last CTA's when it routes a
// decode step itself (router.cu, RouterGpu::run_and_route). Device code of those two sources only.
#pragma once

#include "kernels/cuda/softmax_topk.cuh"
#include "moe/cuda/routing.cuh"
#include "util/hash.h"

namespace epmoe::cuda {

constexpr int kMaxRouterParts = kMaxLogitParts;  // router_chunks() never returns more

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
  int my_id;  // lane k < K: the k-th chosen expert and its probability
  float my_w;
  softmax_topk_rounds<R>(v, E, K, lane, my_id, my_w);
  // The sum of the K weights in slot order, as lane 0 of route_kernel adds them.
  float wsum = 0.f;
  for (int k = 0; k < K; k++) wsum += __shfl_sync(0xffffffffu, my_w, k);
  if (c.norm_topk_prob) my_w /= wsum;
  if (lane < K) write_slot(a, t, gid, lane, my_id, my_w);
}

// SoftmaxTopK of one token by one block of 32 R threads, a thread per expert (route() at every
// step size unless EPMOE_ROUTE_BLOCK=0): softmax_topk_row (kernels/cuda/softmax_topk.cuh), whose
// choices and bits are route_softmax_token's. Why not route_softmax_token's warp: Nsight Compute
// (run 27, one H100) found its one token ~1,750 instructions of one warp at ~7.5 cycles each, 8.9
// us -- 64 partial loads with their addresses in one lane, and K rounds of a dependent warp argmax.
// Here a thread loads and adds its own expert's 16 partials, and the top-k is a rank each thread
// counts against all E keys at once.
template <int R>
__global__ void __launch_bounds__(32 * R) route_softmax_block_kernel(const RouteArgs a) {
  __shared__ SoftmaxTopkScratch<R, 32 * R> sm;
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const uint64_t gid = a.identity ? 0 : a.gids[t];  // (a step input, copied in before its kernels)
  pdl_wait();  // (PDL, common.cuh) before the first read of an earlier kernel's output
  const RoutingConfig& c = a.cfg;
  const int E = c.num_experts, K = c.top_k;
  softmax_topk_row<R, 32 * R>(a.logits + t * E, a.parts, a.part_stride, E, K, sm);
  if (threadIdx.x < K)
    write_slot(a, t, gid, threadIdx.x, sm.id[threadIdx.x], softmax_topk_weight(sm.w, K, threadIdx.x, c.norm_topk_prob));
}

}  // namespace epmoe::cuda
