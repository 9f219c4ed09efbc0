// The router GEMM of RouterGpu (moe/cuda/routing.cuh) in one kernel: the fp32 rows are split
// into their bf16 hi/lo planes while they are staged in shared memory, instead of by a separate
// kernel that writes the planes [xh | xh | xl] to memory for a GEMM to read back. The products,
// the k16 chain of each K' chunk and the order in which the chunks add up are those of the
// split GEMM it replaces (router_split + gemm<bf16, float> over S groups + the in-order sum in
// route()), so the logits have the same bits -- the tests compare the two. One CTA per (chunk,
// m-tile, n-tile) writes chunk s's partial [s][T][E] for route() to add in order.
#include "kernels/cuda/mma_ptx.cuh"
#include "moe/cuda/route_softmax.cuh"
#include "moe/cuda/routing.cuh"
#include "util/env.h"

namespace epmoe::cuda {

namespace {

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::ldmatrix_x4;
using ptx::mma_bf16;
using ptx::swz;

struct RouterArgs {
  const float* x;     // [T, H]
  const bf16* w3;     // [E, 3H] = [wh | wl | wh]
  int64_t T;
  int H, E, S, Kc;    // K' = 3H in S chunks of Kc
  float* out;         // partials [S][T][E]
  // run_and_route: the last CTA to finish (done counts them; it resets it) routes the T tokens
  // from the partials -- route()'s SoftmaxTopK -- so a decode step has no route kernel on its chain.
  bool route = false;
  RouteArgs ra;
  unsigned* done = nullptr;
};

// The cluster form's routing (router_kernel<..., CLUSTER>): the S chunk CTAs of one cluster, BN >=
// E experts each, row tile m0 = 0. Each CTA sends its partial of row t (< T <= S) into CTA t's
// buffer part[s][e] (distributed shared memory); after the cluster barrier CTA t holds row t's S
// partials and routes it: softmax_topk_row adds them in chunk order, route()'s bits and choices.
template <int BM, int BN, int WM, int WN, int MI, int NI>
__device__ void cluster_route(const RouterArgs& p, const float (&acc)[MI][NI][4], float* part, int s) {
  constexpr int NT = WM * WN * 32, TM = BM / WM, TN = BN / WN;
  static_assert(BN % 32 == 0 && BN <= 32 * 8, "cluster routing: a thread per expert slot, R = BN / 32");
  static_assert(NT == BN, "cluster routing: softmax_topk_row's threads are the CTA's");
  __shared__ SoftmaxTopkScratch<BN / 32, NT> sm;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp / WN, wn = warp % WN;
  const uint32_t mine = ptx::smem_u32(part + s * BN);
  ptx::cluster_wait();  // (the arrival at the kernel's start: every CTA of the cluster runs)
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int t = wm * TM + mi * 16 + (lane >> 2) + h * 8;
      if (t >= p.T) continue;
#pragma unroll
      for (int ni = 0; ni < NI; ni++) {
        const int e = wn * TN + ni * 8 + (lane & 3) * 2;
        ptx::cluster_store2(ptx::cluster_map(mine + 4 * e, uint32_t(t)), acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
      }
    }
  ptx::cluster_sync();  // (after it no CTA touches another's shared memory: each may exit)
  const int64_t t = ptx::cluster_ctarank();
  if (t >= p.T) return;
  const RouteArgs& a = p.ra;
  const int K = a.cfg.top_k;
  const uint64_t gid = a.identity ? 0 : a.gids[t];
  softmax_topk_row<BN / 32, NT>(part, p.S, BN, a.cfg.num_experts, K, sm);
  if (int(threadIdx.x) < K)
    write_slot(a, t, gid, int(threadIdx.x), sm.id[threadIdx.x],
               softmax_topk_weight(sm.w, K, int(threadIdx.x), a.cfg.norm_topk_prob));
}

// CLUSTER (RouterRouting::Cluster, a decode step of T <= S rows): the grid is one cluster of the S
// chunk CTAs, each with every expert (BN >= E); each CTA sends its partial of row t to CTA t's
// shared memory, and CTA t routes row t after one cluster barrier -- no partials through L2, no
// last-CTA fence and counter, no route kernel. EARLY_B: the weights' first stages are asked for
// before the PDL wait (they depend on no earlier kernel).
template <int BM, int BN, int WM, int WN, int STAGES, bool CLUSTER = false, bool EARLY_B = false>
__global__ void __launch_bounds__(WM * WN * 32) router_kernel(const RouterArgs p) {
  constexpr int BK = 64, NT = WM * WN * 32, TM = BM / WM, TN = BN / WN, MI = TM / 16, NI = TN / 8;
  constexpr int X_CH = BM * 16 / NT;  // 16-byte chunks of fp32 x per thread per stage (16 per row)
  constexpr int B_CH = BN * 8 / NT;   // of bf16 weights (8 per row)
  constexpr int A_CH = BM * 8 / NT;   // 8-element chunks each thread converts
  static_assert(X_CH >= 1 && B_CH >= 1 && A_CH >= 1 && (BM * 16) % NT == 0 && (BN * 8) % NT == 0, "tile");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  float* sX = reinterpret_cast<float*>(smem_raw);                   // [STAGES][BM][64] fp32
  bf16* sB = reinterpret_cast<bf16*>(sX + STAGES * BM * BK);         // [STAGES][BN][64] swizzled
  bf16* sA = sB + STAGES * BN * BK;                                  // [BM][64] swizzled, this k-tile

  static_assert(!EARLY_B || CLUSTER, "router: early weights only in the cluster form");
  if constexpr (CLUSTER) ptx::cluster_arrive_relaxed();  // (cluster_route waits for it)
  pdl_trigger();
  if constexpr (!EARLY_B) pdl_wait();  // (PDL, common.cuh) x is the previous kernel's output
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WN, wn = warp % WN;
  const int n0 = blockIdx.x * BN;
  const int64_t m0 = int64_t(blockIdx.y) * BM;
  const int s = int(blockIdx.z);
  const int steps = (p.Kc + BK - 1) / BK;  // k-tiles of the chunk (the last one zero-filled past Kc)

  // k-tile kt: K' columns s Kc + kt 64 + [0, 64), those past the chunk zero.
  auto load_x = [&](int stage, int kt) {
    float* dx = sX + stage * BM * BK;
#pragma unroll
    for (int q = 0; q < X_CH; q++) {
      const int idx = tid + q * NT, r = idx >> 4, c4 = idx & 15;  // 4 floats at column c4 * 4
      const int kl = kt * BK + c4 * 4;
      const int kk = s * p.Kc + kl, h = kk % p.H;
      const bool ok = m0 + r < p.T && kl < p.Kc;
      cp_async16(dx + r * BK + c4 * 4, ok ? p.x + (m0 + r) * p.H + h : p.x, ok ? 16 : 0);
    }
  };
  auto load_b = [&](int stage, int kt) {
    bf16* db = sB + stage * BN * BK;
#pragma unroll
    for (int q = 0; q < B_CH; q++) {
      const int idx = tid + q * NT, r = idx >> 3, c = idx & 7;
      const int kl = kt * BK + c * 8;
      const bool ok = n0 + r < p.E && kl < p.Kc;
      cp_async16(db + swz(r, c), ok ? p.w3 + int64_t(n0 + r) * 3 * p.H + s * p.Kc + kl : p.w3, ok ? 16 : 0);
    }
  };
  auto load_stage = [&](int stage, int kt) {
    load_x(stage, kt);
    load_b(stage, kt);
  };
  // EARLY_B: B of the first STAGES - 1 k-tiles before the wait, a commit group each; their x halves
  // follow as the main loop's first groups, so its wait_group<STAGES - 2> still covers both halves
  // of every stage (tc_gemm_kernel's order, gemm.cu).
  if constexpr (EARLY_B) {
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
      if (st < steps) load_b(st, st);
      cp_async_commit();
    }
    pdl_wait();
  }

  float acc[MI][NI][4];
  ptx::zero_tile(acc);
  ptx::cp_async_mainloop<STAGES>(
      steps, [&](int st) { EARLY_B ? load_x(st, st) : load_stage(st, st); }, load_stage, [&](int stage, int kt) {
    // This k-tile's A' columns: x split into bf16 hi (sections 0 and 1 of K') or lo (section 2),
    // router_split's rounding; zero past the chunk, as the split GEMM's zero-filled loads.
    const float* xs = sX + stage * BM * BK;
#pragma unroll
    for (int q = 0; q < A_CH; q++) {
      const int idx = tid + q * NT, r = idx >> 3, c = idx & 7;
      const int kl = kt * BK + c * 8;
      const bool lo = (s * p.Kc + kl) / p.H == 2;
      const float4 v0 = *reinterpret_cast<const float4*>(xs + r * BK + c * 8);
      const float4 v1 = *reinterpret_cast<const float4*>(xs + r * BK + c * 8 + 4);
      const float f[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
      __align__(16) bf16 o[8];
#pragma unroll
      for (int e = 0; e < 8; e++) {
        const bf16 hi = __float2bfloat16_rn(f[e]);
        o[e] = lo ? __float2bfloat16_rn(f[e] - __bfloat162float(hi)) : hi;
      }
      *reinterpret_cast<uint4*>(sA + swz(r, c)) = *reinterpret_cast<const uint4*>(o);
    }
    __syncthreads();
    ptx::warp_tile_mmas<MI, NI, BK / 16>(acc, reinterpret_cast<const unsigned char*>(sA),
                                         reinterpret_cast<const unsigned char*>(sB + stage * BN * BK), wm * TM, wn * TN,
                                         lane, ptx::swz_bytes, mma_bf16);
  });
  cp_async_wait<0>();

  float* out = p.out + int64_t(s) * p.T * p.E;
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int64_t t = m0 + wm * TM + mi * 16 + (lane >> 2) + h * 8;
      if (t >= p.T) continue;
#pragma unroll
      for (int ni = 0; ni < NI; ni++) {
        const int e = n0 + wn * TN + ni * 8 + (lane & 3) * 2;
        const float* v = acc[mi][ni];
        if (e < p.E) out[t * p.E + e] = v[2 * h];
        if (e + 1 < p.E) out[t * p.E + e + 1] = v[2 * h + 1];
      }
    }
  if constexpr (CLUSTER) {
    cluster_route<BM, BN, WM, WN, MI, NI>(p, acc, reinterpret_cast<float*>(sA + BM * BK), s);
    return;
  }
  if (!p.route) return;
  // The last CTA routes (the CUDA samples' threadFenceReduction): every CTA makes its partials
  // visible before it counts itself, so the one that counts last reads them all.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(p.done, 1u) == gridDim.x * gridDim.y * gridDim.z - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int64_t t = warp; t < p.ra.T; t += NT / 32) route_softmax_token<8>(p.ra, t, lane);
  if (tid == 0) *p.done = 0;  // (for the next launch: graph replays too)
}

template <int BM, int BN, int WM, int WN, int STAGES>
void launch_router(const RouterArgs& a, cudaStream_t s) {
  EPMOE_ASSERT(!a.route || (a.done && BM >= a.T), "gpu router: routes in its last CTA only one row tile");
  constexpr int BK = 64;
  constexpr size_t smem = size_t(STAGES) * BM * BK * 4 + size_t(STAGES) * BN * BK * 2 + size_t(BM) * BK * 2;
  static const bool ready = [] {
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(router_kernel<BM, BN, WM, WN, STAGES>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return true;
  }();
  (void)ready;
  const dim3 grid(ceil_div(a.E, BN), unsigned(ceil_div(a.T, BM)), a.S);
  launch_pdl(router_kernel<BM, BN, WM, WN, STAGES>, grid, dim3(WM * WN * 32), smem, s, a);
}

// The cluster form for a decode step (router_kernel<..., CLUSTER>): one cluster of S CTAs of 16 rows
// and 128 experts, the whole chunk's k-tiles in flight (6 for H = 2048), and the S x 128 partials
// CTA t receives.
constexpr int kClusterBN = 128, kClusterStages = 6;
constexpr size_t kClusterSmem = size_t(kClusterStages) * 16 * 64 * 4 + size_t(kClusterStages) * kClusterBN * 64 * 2 +
                                size_t(16) * 64 * 2 + size_t(kMaxRouterParts) * kClusterBN * 4;
template <bool EARLY_B>
constexpr auto cluster_kernel = router_kernel<16, kClusterBN, 1, 4, kClusterStages, true, EARLY_B>;

// Whether a cluster of S of these CTAs fits on this GPU at all (16 is past the portable 8: a GPC
// must hold them), asked once per S and form.
template <bool EARLY_B>
bool cluster_fits(int S) {
  static int fits[kMaxRouterParts + 1] = {};  // 0 unknown, 1 yes, -1 no
  if (S < 1 || S > kMaxRouterParts) return false;
  if (fits[S] == 0) {
    auto k = cluster_kernel<EARLY_B>;
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kClusterSmem)));
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, 1, unsigned(S));
    cfg.blockDim = dim3(128);
    cfg.dynamicSmemBytes = kClusterSmem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = unsigned(S);
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, k, &cfg);
    if (e != cudaSuccess) (void)cudaGetLastError();  // (a size this GPU cannot run: the form is off, no error)
    fits[S] = e == cudaSuccess && clusters >= 1 ? 1 : -1;
  }
  return fits[S] > 0;
}

RouterRouting g_router_routing = [] {
  const long long v = env_int("EPMOE_ROUTER_ROUTES", 0);
  return v == 1 ? RouterRouting::LastCta : v == 2 ? RouterRouting::Cluster : v == 3 ? RouterRouting::ClusterEarly
                                                                                     : RouterRouting::Kernel;
}();

}  // namespace

RouterRouting router_routing() { return g_router_routing; }
void set_router_routing(RouterRouting r) { g_router_routing = r; }

bool router_cluster_routes(const RouteArgs& ra, int64_t T, int H, RouterRouting form) {
  // (The last-CTA form's shapes, and a CTA a row, a thread an expert.)
  const int S = router_chunks(H);
  if (!(form == RouterRouting::Cluster || form == RouterRouting::ClusterEarly) || !router_routes(ra, T) || T > S ||
      ra.cfg.num_experts > kClusterBN || ra.cfg.top_k > ra.cfg.num_experts)
    return false;
  return form == RouterRouting::ClusterEarly ? cluster_fits<true>(S) : cluster_fits<false>(S);
}

// Rows of one CTA: 16 for decode-sized inputs (more CTAs over the chunks' weights), then tiles
// that re-read the weights fewer times. Every chunk is its own CTA and route() adds the partials:
// a CTA that ran every chunk of its rows and added them itself (tried) either reads all the
// weights once per 32 rows (L2-bound: 111 us at 4096 rows) or leaves most of the chip idle.

bool router_routes(const RouteArgs& ra, int64_t T) {
  return T >= 1 && T <= kRouterRoutesRows && ra.cfg.kind == RoutingKind::SoftmaxTopK && ra.cfg.num_experts <= 256 &&
         ra.cfg.top_k <= 32 && !ra.general_kernel;
}

void router_logits(const float* x, const bf16* w3, int64_t T, int H, int E, int S, float* out, cudaStream_t s,
                   const RouteArgs* route, unsigned* done, RouterRouting form) {
  if (T == 0) return;
  EPMOE_ASSERT(H % 8 == 0 && (3 * H) % (8 * S) == 0, "gpu router: H a multiple of 8 and 3H of 8 S");
  RouterArgs a;
  a.x = x, a.w3 = w3, a.T = T, a.H = H, a.E = E, a.S = S, a.Kc = 3 * H / S, a.out = out;
  if (route && (form == RouterRouting::Cluster || form == RouterRouting::ClusterEarly)) {
    EPMOE_ASSERT(router_cluster_routes(*route, T, H, form) && S == router_chunks(H) && route->cfg.num_experts == E,
                 "gpu router: the cluster form routes SoftmaxTopK over <= 128 experts, rows <= the chunks, on a GPU "
                 "that fits the cluster");
    a.ra = *route;
    a.ra.T = T;
    const dim3 grid(1, 1, unsigned(S)), cluster(1, 1, unsigned(S));
    if (form == RouterRouting::ClusterEarly)
      launch_pdl_cluster(cluster_kernel<true>, grid, dim3(128), cluster, kClusterSmem, s, a);
    else launch_pdl_cluster(cluster_kernel<false>, grid, dim3(128), cluster, kClusterSmem, s, a);
    return;
  }
  if (route) {
    EPMOE_ASSERT(router_routes(*route, T) && S <= kMaxRouterParts && route->cfg.num_experts == E,
                 "gpu router: routing in the router's last CTA needs SoftmaxTopK, <= 256 experts and <= 16 rows");
    a.route = true;
    a.ra = *route;
    a.ra.logits = out;
    a.ra.parts = S;
    a.ra.part_stride = T * E;
    a.ra.T = T;
    a.done = done;
  }
  // (16 x 16 tiles of one warp with every k-tile of the chunk in flight were slower at one row:
  // 8.8 against 6.6 us.)
  if (T <= 128) launch_router<16, 32, 1, 2, 4>(a, s);
  else if (T <= 256) launch_router<32, 128, 2, 4, 3>(a, s);
  else launch_router<64, 128, 2, 4, 3>(a, s);
}

}  // namespace epmoe::cuda
