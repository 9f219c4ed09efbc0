// Routing on the GPU (moe/routing.cc is the reference): one warp per token computes the scores
// of every strategy of RoutingConfig, the top-k, the weights, and the replica of each slot.
#include "moe/cuda/routing.cuh"
#include "moe/cuda/route_softmax.cuh"
#include "util/env.h"

namespace epmoe::cuda {

namespace {

// ---------------------------------------------------------------------------------------------
// Routing: one warp per token. Scores live in shared memory (3 E floats per warp).

// topk_desc of moe/routing.cc over v[0..n), skipping the ids already in sel[0..j).
__device__ inline void warp_topk(const float* v, int n, int k, int* sel) {
  const int lane = threadIdx.x & 31;
  for (int j = 0; j < k; j++) {
    float bv = -INFINITY;
    int bi = -1;
    for (int i = lane; i < n; i += 32) {
      bool taken = false;
      for (int q = 0; q < j; q++) taken |= sel[q] == i;
      if (taken) continue;
      if (bi < 0 || v[i] > bv) bv = v[i], bi = i;
    }
    warp_argmax(bv, bi);
    if (lane == 0) sel[j] = bi;
    __syncwarp();
  }
}

__global__ void route_kernel(const RouteArgs a) {
  extern __shared__ float rsm[];
  pdl_trigger();
  pdl_wait();  // (PDL, common.cuh) before the first read of an earlier kernel's output
  const RoutingConfig& c = a.cfg;
  const int E = c.num_experts, K = c.top_k;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (t >= a.T) return;
  float* sc = rsm + size_t(warp) * (3 * E + 32);  // score (softmax p or sigmoid)
  float* ch = sc + E;                              // choice (biased / masked)
  float* gs = ch + E;                              // group scores
  int* sel = reinterpret_cast<int*>(gs + E);       // [K <= 32]
  const uint64_t gid = a.identity ? 0 : a.gids[t];  // loaded early: its latency overlaps the rest
  // The logits of this token (the split-K partials summed in order).
  // All partial loads are issued before the first add (a loop of dependent load-add pairs costs
  // one memory latency per partial: 20 us at one token).
  for (int e = lane; e < E; e += 32) {
    float vals[kMaxRouterParts];
#pragma unroll
    for (int p = 0; p < kMaxRouterParts; p++) vals[p] = p < a.parts ? a.logits[p * a.part_stride + t * E + e] : 0.f;
    float v = 0.f;
#pragma unroll
    for (int p = 0; p < kMaxRouterParts; p++)
      if (p < a.parts) v += vals[p];
    sc[e] = v;
  }
  __syncwarp();

  const bool sigmoid = c.kind == RoutingKind::SigmoidGroupLimited;
  if (sigmoid) {
    for (int e = lane; e < E; e += 32) {
      const float s = 1.0f / (1.0f + expf(-sc[e]));
      sc[e] = s;
      ch[e] = s + (a.bias ? a.bias[e] : 0.0f);
    }
  } else {
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, sc[e]);
    m = warp_max(m);
    float sum = 0.f;
    for (int e = lane; e < E; e += 32) {
      const float v = expf(sc[e] - m);
      sc[e] = v;
      sum += v;
    }
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    __syncwarp();
    for (int e = lane; e < E; e += 32) {
      sc[e] *= inv;
      ch[e] = sc[e];
    }
  }
  __syncwarp();

  const bool grouped = sigmoid || (c.kind == RoutingKind::SoftmaxGroupLimited && c.group_limited);
  const int G = c.n_group;
  if (grouped && c.topk_group < G) {
    const int per = E / G;
    for (int g = lane; g < G; g += 32) {
      const float* s = ch + g * per;
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int i = 0; i < per; i++) {
        const float v = s[i];
        if (v > b1) b2 = b1, b1 = v;
        else if (v > b2) b2 = v;
      }
      gs[g] = sigmoid ? b1 + b2 : b1;  // DeepSeek-V3: sum of the best two; V2: max
    }
    __syncwarp();
    warp_topk(gs, G, c.topk_group, sel);
    // Mask the experts of dropped groups to -inf (never 0: see moe/routing.h).
    for (int e = lane; e < E; e += 32) {
      const int g = e / per;
      bool kept = false;
      for (int q = 0; q < c.topk_group; q++) kept |= sel[q] == g;
      if (!kept) ch[e] = -INFINITY;
    }
    __syncwarp();
  }
  warp_topk(ch, E, K, sel);

  float* wsm = gs;  // the group scores are no longer needed: the K weights go here
  if (lane == 0) {
    float* w = wsm;
    float sum = 0.f;
    for (int k = 0; k < K; k++) {
      w[k] = sc[sel[k]];
      sum += w[k];
    }
    switch (c.kind) {
      case RoutingKind::SoftmaxTopK:
        if (c.norm_topk_prob)
          for (int k = 0; k < K; k++) w[k] /= sum;
        break;
      case RoutingKind::SigmoidGroupLimited:
        if (c.norm_topk_prob)
          for (int k = 0; k < K; k++) w[k] /= (sum + 1e-20f);
        for (int k = 0; k < K; k++) w[k] *= c.routed_scaling_factor;
        break;
      case RoutingKind::SoftmaxGroupLimited:
        if (c.norm_topk_prob && K > 1)
          for (int k = 0; k < K; k++) w[k] /= (sum + 1e-20f);
        for (int k = 0; k < K; k++) w[k] *= c.routed_scaling_factor;
        break;
    }
  }
  __syncwarp();
  // One lane per slot: the replica lookups of the K slots run in parallel.
  if (lane < K) write_slot(a, t, gid, lane, sel[lane], wsm[lane]);
}

// SoftmaxTopK from registers (route_softmax.cuh), one warp per token.
template <int R>
__global__ void route_softmax_kernel(const RouteArgs a) {
  pdl_trigger();
  pdl_wait();  // (PDL, common.cuh) before the first read of an earlier kernel's output
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t < a.T) route_softmax_token<R>(a, t, threadIdx.x & 31);
}

__global__ void router_split_kernel(const float* x, int64_t T, int H, int S, bf16* out) {
  pdl_trigger();
  pdl_wait();  // (PDL, common.cuh) before the first read of an earlier kernel's output
  const int64_t n = T * H;
  const int Kc = 3 * H / S;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / H;
    const int h = int(i - t * H);
    const float v = x[i];
    const bf16 hi = __float2bfloat16_rn(v);
    const bf16 lo = __float2bfloat16_rn(v - __bfloat162float(hi));
    const bf16 parts[3] = {hi, hi, lo};
#pragma unroll
    for (int q = 0; q < 3; q++) {
      const int kk = q * H + h, s = kk / Kc, c = kk - s * Kc;
      out[(int64_t(s) * T + t) * Kc + c] = parts[q];
    }
  }
}

}  // namespace

namespace {

// EPMOE_ROUTE_BLOCK=0: SoftmaxTopK one warp per token (route_softmax_kernel), for measuring.
bool route_block_per_token() {
  static const bool on = !env_off("EPMOE_ROUTE_BLOCK");
  return on;
}

// SoftmaxTopK with every score in registers, R = ceil(E / 32) a lane: a block of 32 R threads per
// token (route_softmax_block_kernel) or a warp per token, four to a block (route_softmax_kernel).
template <int R>
void launch_route_softmax(const RouteArgs& a, bool block_per_token, cudaStream_t s) {
  if (block_per_token) launch_pdl(route_softmax_block_kernel<R>, dim3(unsigned(a.T)), dim3(32 * R), 0, s, a);
  else launch_pdl(route_softmax_kernel<R>, dim3(unsigned(ceil_div(a.T, 4))), dim3(128), 0, s, a);
}

}  // namespace

void route(const RouteArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  const int E = a.cfg.num_experts;
  EPMOE_ASSERT(a.cfg.top_k <= 32 && a.cfg.n_group <= E, "gpu routing: top_k <= 32 and n_group <= E");
  EPMOE_ASSERT(a.parts >= 1 && a.parts <= kMaxRouterParts, "gpu routing: 1..16 logit partials");
  constexpr int warps = 4;
  if (a.cfg.kind == RoutingKind::SoftmaxTopK && E <= 256 && !a.general_kernel) {
    // (The block kernel's slots are the K best of E ranks: K <= E.)
    const bool block = !a.warp_per_token && a.cfg.top_k <= E && route_block_per_token();
    if (E <= 32) launch_route_softmax<1>(a, block, s);
    else if (E <= 64) launch_route_softmax<2>(a, block, s);
    else if (E <= 128) launch_route_softmax<4>(a, block, s);
    else launch_route_softmax<8>(a, block, s);
    return;
  }
  const size_t smem = size_t(warps) * (3 * E + 32) * sizeof(float);
  EPMOE_ASSERT(smem <= 48 * 1024, "gpu routing: too many experts for one warp's shared memory");
  launch_pdl(route_kernel, dim3(ceil_div(a.T, warps)), dim3(warps * 32), smem, s, a);
}

// Routing replay: the given logical choice (a.logical) to physical slots, as write_slot would.
__global__ void replica_slots_kernel(const RouteArgs a) {
  pdl_trigger();
  pdl_wait();
  const int K = a.cfg.top_k;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < a.T * K; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / K;
    const int k = int(i - t * K), l = a.logical[i];
    int phys = l;
    if (!a.identity) {
      const int r0 = a.rep_off[l], nr = a.rep_off[l + 1] - r0;
      phys = nr == 1 ? a.rep_list[r0] : a.rep_list[r0 + int(replica_index(a.gids[t], k, uint64_t(nr)))];
    }
    a.physical[i] = phys;
  }
}

void replica_slots(const RouteArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  EPMOE_ASSERT(a.logical && a.physical, "replica_slots: logical and physical slots");
  const int64_t n = a.T * a.cfg.top_k;
  launch_pdl(replica_slots_kernel, dim3(unsigned(std::min<int64_t>(ceil_div(n, int64_t(256)), 1024))), dim3(256), 0, s, a);
  EPMOE_CUDA_LAUNCHED();
}

int router_chunks(int H) {
  for (int S : {16, 8, 4, 2})
    if ((3 * H) % (8 * S) == 0) return S;
  return 1;
}

void router_split(const float* x, int64_t T, int H, int S, bf16* out, cudaStream_t s) {
  if (T == 0) return;
  launch_pdl(router_split_kernel, dim3(grid_for(T * H)), dim3(256), 0, s, x, T, H, S, out);
}

std::vector<bf16> router_split_weights(const std::vector<float>& w, int E, int H) {
  std::vector<bf16> out(size_t(E) * 3 * size_t(H));
  for (int e = 0; e < E; e++)
    for (int h = 0; h < H; h++) {
      const float v = w[size_t(e) * H + h];
      const bf16 hi = __float2bfloat16_rn(v);
      const bf16 lo = __float2bfloat16_rn(v - __bfloat162float(hi));
      bf16* row = &out[size_t(e) * 3 * H];
      row[h] = hi;
      row[H + h] = lo;
      row[2 * H + h] = hi;
    }
  return out;
}

}  // namespace epmoe::cuda
