// The softmax top-k of one row of router logits by one CTA (SoftmaxTopK: Qwen, Mixtral), written
// once for the two kernels that route: the route kernel of the MoE layer (moe/cuda/route_softmax.cuh,
// a block per token) and the expert GEMM of a decode step that routes its own job
// (GemmArgs::job_route, gemm.cu) -- so a token's experts and weights are one function's bits
// whichever kernel computed them. Device code only.
//
// The arithmetic is route_softmax_token's (moe/cuda/route_softmax.cuh, the warp-per-token form
// the tests compare against): each logit the in-order sum of its split-K partials; the max (exact
// in any order); exp(x - max); the softmax's sum as warp 0's per-lane sums over e = lane + 32 r in
// ascending r and then the warp tree; v = exp * (1 / sum). The choice: v >= +0 (never -0), so a
// float's bits order like its value, and key = (bits << 32) | ~e ranks by value, then lower e
// first -- the K best ranks are the experts that K rounds of "best untaken, lowest e on ties" pick,
// in the same order. A NaN has no such order; a row with one is chosen by those rounds themselves
// (softmax_topk_rounds, warp 0), as route_softmax_token chooses it.
#pragma once

#include "kernels/cuda/common.cuh"

namespace epmoe::cuda {

constexpr int kMaxLogitParts = 16;  // split-K partials of a router's logits (router_chunks() <= 16)

// K rounds of (the lane's best untaken score, lowest e first) + warp argmax over v[r] of expert
// e = lane + 32 r (e < E): lane j < K gets the j-th chosen expert and its score.
template <int R>
__device__ inline void softmax_topk_rounds(const float (&v)[R], int E, int K, int lane, int& my_id, float& my_w) {
  uint32_t taken = 0;
  my_id = -1;
  my_w = 0.f;
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
}

// Shared memory of softmax_topk_row for up to 32 R experts and NT threads.
template <int R, int NT>
struct SoftmaxTopkScratch {
  static constexpr int NE = 32 * R;
  float val[NE];                       // exp(x - max) of expert e, then its probability
  __align__(16) unsigned long long key[NE];  // rank keys (0: no expert)
  float red[NT / 32 > R ? NT / 32 : R];      // per-warp maxima, then the sum
  int id[32];                          // the chosen experts, in slot order
  float w[32];                         // their probabilities (not renormalised)
};

// Row `logits` (partial p at logits + p * part_stride, E values each) of E <= 32 R experts, top K <=
// min(E, 32), by the NT threads of the CTA (every one of them must call it: it synchronises). On
// return (after a barrier) s.id[k], s.w[k] hold slot k's expert and probability for every k < K.
template <int R, int NT>
__device__ inline void softmax_topk_row(const float* logits, int parts, int64_t part_stride, int E, int K,
                                        SoftmaxTopkScratch<R, NT>& s) {
  constexpr int NE = 32 * R, PER = (NE + NT - 1) / NT;  // experts a thread holds: e = tid + NT q
  static_assert(NT % 32 == 0, "whole warps");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Every partial of every expert of this thread in flight before the first add.
  float part[PER][kMaxLogitParts];
#pragma unroll
  for (int q = 0; q < PER; q++) {
    const int e = tid + NT * q;
#pragma unroll
    for (int p = 0; p < kMaxLogitParts; p++) part[q][p] = p < parts && e < E ? logits[p * part_stride + e] : 0.f;
  }
  float x[PER];
  float m = -INFINITY;
#pragma unroll
  for (int q = 0; q < PER; q++) {
    float v = 0.f;
#pragma unroll
    for (int p = 0; p < kMaxLogitParts; p++)
      if (p < parts) v += part[q][p];
    x[q] = v;
    if (tid + NT * q < E) m = fmaxf(m, v);
  }
  m = warp_max(m);
  if (lane == 0) s.red[warp] = m;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < NT / 32; w++) m = fmaxf(m, s.red[w]);
  float ex[PER];
#pragma unroll
  for (int q = 0; q < PER; q++) {
    const int e = tid + NT * q;
    ex[q] = e < E ? expf(x[q] - m) : 0.f;
    if (e < NE) s.val[e] = ex[q];
  }
  __syncthreads();  // (also: every thread has read red)
  if (warp == 0) {
    float sum = 0.f;
#pragma unroll
    for (int r = 0; r < R; r++)
      if (lane + 32 * r < E) sum += s.val[lane + 32 * r];
    sum = warp_sum(sum);
    if (lane == 0) s.red[0] = sum;
  }
  __syncthreads();
  const float inv = 1.0f / s.red[0];
  bool nan = false;
  unsigned long long mine[PER];
#pragma unroll
  for (int q = 0; q < PER; q++) {
    const int e = tid + NT * q;
    const float v = ex[q] * inv;
    const bool expert = e < E;
    nan |= expert && isnan(v);
    mine[q] = expert ? (static_cast<unsigned long long>(__float_as_uint(v)) << 32) | ~static_cast<unsigned>(e) : 0ull;
    if (e < NE) s.val[e] = v, s.key[e] = mine[q];
  }
  if (__syncthreads_or(nan)) {
    // The rounds over the probabilities, as route_softmax_token runs them (val holds them all).
    if (warp == 0) {
      float v[R];
#pragma unroll
      for (int r = 0; r < R; r++) v[r] = s.val[lane + 32 * r];
      int my_id;
      float my_w;
      softmax_topk_rounds<R>(v, E, K, lane, my_id, my_w);
      if (lane < K) s.id[lane] = my_id, s.w[lane] = my_w;
    }
    __syncthreads();
    return;
  }
  const ulonglong2* k2 = reinterpret_cast<const ulonglong2*>(s.key);
#pragma unroll
  for (int q = 0; q < PER; q++) {
    const int e = tid + NT * q;
    if (e >= E) continue;
    int rank = 0;
#pragma unroll 8
    for (int j = 0; j < NE / 2; j++) {
      const ulonglong2 o = k2[j];
      rank += (o.x > mine[q]) + (o.y > mine[q]);
    }
    if (rank < K) s.id[rank] = e, s.w[rank] = ex[q] * inv;
  }
  __syncthreads();
}

// The K chosen weights as the routing leaves them: in slot order, their sum added in slot order
// (route_softmax_token's lane 0 order) and each divided by it when renormalised.
__device__ inline float softmax_topk_weight(const float* w, int K, int k, bool renormalize) {
  if (!renormalize) return w[k];
  float sum = 0.f;
  for (int j = 0; j < K; j++) sum += w[j];
  return w[k] / sum;
}

}  // namespace epmoe::cuda
