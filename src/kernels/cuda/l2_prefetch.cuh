// Weight bytes requested into L2 from a second stream while the step's chain runs kernels that
// read little from HBM (issue 33, run 34).
//
// Why: at one sequence a decode layer's chain spends ~20 us in kernels that are latency, not
// bytes (the two norms, decode attention, the router, the route), while the projections after
// them stream 21 MB (q/k/v) and 17 MB (o) at about half of HBM's rate: their warps wait on their
// own loads. A prefetch forked from the chain at the kernel before such a window (the o projection
// of this layer while q/k/v and attention run; the next layer's q/k/v while the post-attention
// norm, the router and the route run) fills L2 with what the projection reads next, and the
// projection then reads it from L2. The experts' weights stream past meanwhile (75 MB a layer at
// one sequence); their loads carry an evict_first hint (GemmArgs::b_evict_first) so that they
// replace each other rather than what was prefetched.
//
// The bits: a prefetch changes where bytes come from, never what any kernel computes.
#pragma once

#include <cstddef>

#include "kernels/cuda/common.cuh"

namespace epmoe::cuda {

// EPMOE_L2_PREFETCH, a bit mask: 1 a layer's o projection weights after its input norm, 2 the
// next layer's q/k/v after the o projection, 4 the layer's router weights with the o projection's,
// 8 the o projection's after the q/k/v projection (instead of after the norm: bit 1), 16 the
// chosen experts' down weights after the route, while gate+up streams its own.
// EPMOE_L2_PREFETCH_CHUNK: bytes a thread requests at once (a multiple of 16).
int l2_prefetch_mask();
void set_l2_prefetch_mask(int mask);  // tests: every mask gives the same bits

// The side stream and its two events, one per model. request() forks from `main` where the chain
// stands now: the prefetch kernel starts once the last kernel queued on main has completed and
// runs beside the kernels queued after it. join() makes main wait for every request so far (a
// captured step must end joined). Both work inside a stream capture (the graph gets a branch).
class L2Prefetcher {
 public:
  L2Prefetcher() = default;
  ~L2Prefetcher();
  L2Prefetcher(const L2Prefetcher&) = delete;
  L2Prefetcher& operator=(const L2Prefetcher&) = delete;
  void request(const void* p, size_t bytes, cudaStream_t main);
  // The weights of the experts a step's jobs chose: for each of the n ids (read on the device when
  // the side kernel runs), id - id_base in [0, n_local): `bytes` at base + that * bytes.
  void request_experts(const int32_t* ids, int n, int id_base, int n_local, const void* base, size_t bytes,
                       cudaStream_t main);
  void join(cudaStream_t main);

 private:
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ = nullptr, joined_ = nullptr;
  bool pending_ = false;
  void fork(cudaStream_t main);
};

}  // namespace epmoe::cuda
