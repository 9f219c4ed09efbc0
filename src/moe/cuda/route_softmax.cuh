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

}  // namespace epmoe::cuda
