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

template <int BM, int BN, int WM, int WN, int STAGES>
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

  pdl_trigger();
  pdl_wait();  // (PDL, common.cuh) x is the previous kernel's output
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WN, wn = warp % WN;
  const int n0 = blockIdx.x * BN;
  const int64_t m0 = int64_t(blockIdx.y) * BM;
  const int s = int(blockIdx.z);
  const int steps = (p.Kc + BK - 1) / BK;  // k-tiles of the chunk (the last one zero-filled past Kc)

  // k-tile kt: K' columns s Kc + kt 64 + [0, 64), those past the chunk zero.
  auto load_stage = [&](int stage, int kt) {
    float* dx = sX + stage * BM * BK;
    bf16* db = sB + stage * BN * BK;
#pragma unroll
    for (int q = 0; q < X_CH; q++) {
      const int idx = tid + q * NT, r = idx >> 4, c4 = idx & 15;  // 4 floats at column c4 * 4
      const int kl = kt * BK + c4 * 4;
      const int kk = s * p.Kc + kl, h = kk % p.H;
      const bool ok = m0 + r < p.T && kl < p.Kc;
      cp_async16(dx + r * BK + c4 * 4, ok ? p.x + (m0 + r) * p.H + h : p.x, ok ? 16 : 0);
    }
#pragma unroll
    for (int q = 0; q < B_CH; q++) {
      const int idx = tid + q * NT, r = idx >> 3, c = idx & 7;
      const int kl = kt * BK + c * 8;
      const bool ok = n0 + r < p.E && kl < p.Kc;
      cp_async16(db + swz(r, c), ok ? p.w3 + int64_t(n0 + r) * 3 * p.H + s * p.Kc + kl : p.w3, ok ? 16 : 0);
    }
  };

  float acc[MI][NI][4];
  ptx::zero_tile(acc);
  ptx::cp_async_mainloop<STAGES>(steps, [&](int st) { load_stage(st, st); }, load_stage, [&](int stage, int kt) {
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

}  // namespace

// Rows of one CTA: 16 for decode-sized inputs (more CTAs over the chunks' weights), then tiles
// that re-read the weights fewer times. Every chunk is its own CTA and route() adds the partials:
// a CTA that ran every chunk of its rows and added them itself (tried) either reads all the
// weights once per 32 rows (L2-bound: 111 us at 4096 rows) or leaves most of the chip idle.

bool router_routes(const RouteArgs& ra, int64_t T) {
  return T >= 1 && T <= kRouterRoutesRows && ra.cfg.kind == RoutingKind::SoftmaxTopK && ra.cfg.num_experts <= 256 &&
         ra.cfg.top_k <= 32 && !ra.general_kernel;
}

void router_logits(const float* x, const bf16* w3, int64_t T, int H, int E, int S, float* out, cudaStream_t s,
                   const RouteArgs* route, unsigned* done) {
  if (T == 0) return;
  EPMOE_ASSERT(H % 8 == 0 && (3 * H) % (8 * S) == 0, "gpu router: H a multiple of 8 and 3H of 8 S");
  RouterArgs a;
  a.x = x, a.w3 = w3, a.T = T, a.H = H, a.E = E, a.S = S, a.Kc = 3 * H / S, a.out = out;
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
