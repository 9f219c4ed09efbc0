// The router of the MoE layer on the GPU, twin of moe/routing.cc (the CPU code is the reference):
// the fp32-accurate router GEMM (RouterGpu) and route(), every strategy of RoutingConfig, then the
// replica of each slot (Placement::choose's hash, util/hash.h).
#pragma once

#include <vector>

#include "io/hf_config.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"

namespace epmoe::cuda {

// moe/routing.cc: route(), then Placement::choose() for the replica of each slot.
struct RouteArgs {
  RoutingConfig cfg;
  const float* logits = nullptr;  // [T, E]
  const float* bias = nullptr;    // [E] correction bias or nullptr
  int64_t T = 0;
  const uint64_t* gids = nullptr;     // [T] token global ids
  const int32_t* rep_off = nullptr;   // [E + 1] replicas of logical e: rep_list[rep_off[e] .. rep_off[e+1])
  const int32_t* rep_list = nullptr;  // [P]
  bool identity = false;              // no replicas: physical = logical (the tables are not read)
  int parts = 1;                      // logits = sum of `parts` partials in order (split-K router)
  int64_t part_stride = 0;            // elements from one partial [T, E] to the next
  int32_t* logical = nullptr;         // [T, K] (may be nullptr)
  int32_t* physical = nullptr;        // [T, K]
  float* weights = nullptr;           // [T, K]
  // SoftmaxTopK runs a register-resident kernel; true runs the general shared-memory kernel
  // instead (the two must give the same bits: the tests compare them).
  bool general_kernel = false;
  // SoftmaxTopK: one warp per token (route_softmax_kernel) instead of one block per token
  // (route_softmax_block_kernel, the default); the same bits (the tests compare them).
  bool warp_per_token = false;
};
void route(const RouteArgs& a, cudaStream_t s);
// Routing replay: a.physical [T, K] from a given logical choice a.logical (the replica of each slot
// as route() would pick it); the weights are the given ones, nothing else is written.
void replica_slots(const RouteArgs& a, cudaStream_t s);

// The fp32-accurate router on tensor cores: x . w = xh.wh + xh.wl + xl.wh with x = xh + xl and
// w = wh + wl split into bf16 (products exact in fp32, accumulation in fp32; the dropped xl.wl is
// ~2^-18 relative). As one GEMM over K' = 3H: A' = [xh | xh | xl], B' = [wh | wl | wh], cut into
// S fixed chunks of K' (a split-K that depends only on H, never on T: batch-invariant), summed in
// chunk order. router_split writes A' as [S][T][K'/S] for that GEMM: the reference the one-kernel
// router_logits below is tested against.
void router_split(const float* x, int64_t T, int H, int S, bf16* out, cudaStream_t s);
// Host side: B' = [wh | wl | wh] of fp32 router weights [E, H].
std::vector<bf16> router_split_weights(const std::vector<float>& w, int E, int H);
// The number of K' chunks for hidden size H (chunks of a multiple of 8 elements).
int router_chunks(int H);

// router_split + the split GEMM over S chunks in one kernel (moe/cuda/router.cu), the same bits:
// x [T, H] fp32, w3 = router_split_weights [E, 3H]; writes the S partials [S][T][E] to out, for
// route() to add in order.
// route (decode steps, router_routes): the router's last CTA also routes the T rows -- route()'s
// SoftmaxTopK over those partials, the same bits -- with ra's outputs; done: a zeroed counter the
// kernel leaves zeroed.
// Who routes a decode step's rows (EPMOE_ROUTER_ROUTES; RouterGpu::routes):
//   Kernel        the route kernel after the router (route(); the default)
//   LastCta       the router's last CTA (1; run 22, measured slower at 8 sequences in run 23)
//   Cluster       the router as one thread-block cluster of its S chunk CTAs, CTA t routing row t
//                 from the partials the others send to its shared memory (2; issue 33, run 36)
//   ClusterEarly  the same with the router's first weight stages asked for before its PDL wait (3)
// Every form gives route()'s ids, replicas and weight bits (GpuRouting tests).
enum class RouterRouting { Kernel, LastCta, Cluster, ClusterEarly };
RouterRouting router_routing();
void set_router_routing(RouterRouting r);  // (tests and benchmarks)
constexpr int kRouterRoutesRows = 16;
bool router_routes(const RouteArgs& ra, int64_t T);  // LastCta's shapes
// The cluster forms' shapes: SoftmaxTopK over <= 128 experts, top-k <= 32, T <= the router's
// chunks, and a GPU on which a cluster of that many CTAs fits.
bool router_cluster_routes(const RouteArgs& ra, int64_t T, int H, RouterRouting form);
void router_logits(const float* x, const bf16* w3, int64_t T, int H, int E, int S, float* out, cudaStream_t s,
                   const RouteArgs* route = nullptr, unsigned* done = nullptr,
                   RouterRouting form = RouterRouting::LastCta);

// The router of a MoE layer: logits [T, E] in fp32 from the normalised rows (fp32).
// bf16 mode: the split-bf16 tensor-core GEMM above (fp32-grade logits, batch-invariant);
// f32 mode: the fp32 SIMT GEMM.
struct RouterGpu {
  int E = 0, H = 0, S = 1;
  bool split = true;
  DeviceArray<float> w32;  // [E, H] (f32 mode)
  DeviceArray<bf16> w3;    // [E, 3H] = [wh | wl | wh] (bf16 mode)
  DeviceArray<float> part; // [S][T][E]

  void init(const std::vector<float>& w, int E_, int H_, bool split_) {
    E = E_, H = H_, split = split_, S = router_chunks(H_);
    if (split) w3.upload(router_split_weights(w, E, H));
    else w32.upload(w);
    done.upload(std::vector<unsigned>{0u});  // (here: a decode step's graph capture may not allocate)
  }
  // Logits for route(): either one [T, E] array (parts = 1) or S split-K partials [S][T, E] that
  // route() sums in order.
  struct Logits {
    const float* ptr;
    int parts;
    int64_t stride;
  };
  // Decode steps (router_routes: SoftmaxTopK, up to 16 rows, split mode): the logits and the
  // routing of ra in one launch, the routing by the router's last CTA (moe/cuda/router.cu).
  // can_route: the shapes allow it; routes: and EPMOE_ROUTER_ROUTES=1 asks for it.
  // form: router_routing() unless a test names one.
  bool can_route(const RouteArgs& ra, int64_t T, RouterRouting form = RouterRouting::LastCta) const {
    if (!split) return false;
    if (form == RouterRouting::LastCta) return router_routes(ra, T);
    return router_cluster_routes(ra, T, H, form);
  }
  bool routes(const RouteArgs& ra, int64_t T) const {
    const RouterRouting form = router_routing();
    return form != RouterRouting::Kernel && can_route(ra, T, form);
  }
  void run_and_route(const float* x, int64_t T, const RouteArgs& ra, cudaStream_t s) {
    run_and_route(x, T, ra, s, router_routing());
  }
  void run_and_route(const float* x, int64_t T, const RouteArgs& ra, cudaStream_t s, RouterRouting form) {
    part.reserve(size_t(S) * size_t(std::max<int64_t>(T, 1)) * size_t(E));
    router_logits(x, w3.data(), T, H, E, S, part.data(), s, &ra, done.data(), form);
  }
  DeviceArray<unsigned> done;  // the last-CTA counter of run_and_route
  Logits run(const float* x, int64_t T, cudaStream_t s) {
    GemmArgs g;
    g.N = E;
    if (!split) {
      full.reserve(size_t(std::max<int64_t>(T, 1)) * size_t(E));
      g.A = x, g.lda = H, g.B = w32.data(), g.ldb = H, g.M = int(T), g.K = H, g.C = full.data(), g.ldc = E;
      if (T > 0) gemm<float, float>(g, Epilogue::Store, s);
      return {full.data(), 1, 0};
    }
    part.reserve(size_t(S) * size_t(std::max<int64_t>(T, 1)) * size_t(E));
    router_logits(x, w3.data(), T, H, E, S, part.data(), s);
    return {part.data(), S, int64_t(T) * E};
  }
  DeviceArray<float> full;  // [T, E] (f32 mode)
};

}  // namespace epmoe::cuda
