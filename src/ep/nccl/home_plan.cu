#include "ep/nccl/home_plan.cuh"

namespace epmoe::cuda {

namespace {

constexpr int kHomeThreads = 1024;

__global__ void __launch_bounds__(kHomeThreads) home_plan_kernel(const HomePlanArgs a) {
  __shared__ int scratch[33];
  __shared__ int rec_off[kMaxOwnerRanks], ans_off[kMaxOwnerRanks];
  const int tid = threadIdx.x, R = a.rk.R, K = a.K;
  const int64_t n = a.t1 - a.t0;
  const int64_t chunk = (n + kHomeThreads - 1) / kHomeThreads;
  const int64_t c0 = a.t0 + lmin(n, tid * chunk), c1 = a.t0 + lmin(n, (tid + 1) * chunk);
  if (a.fixed > 0 && a.rec_token)
    for (int64_t i = tid; i < a.rec_bound; i += kHomeThreads) a.rec_token[i] = -1;
  int nrec[kMaxOwnerRanks], nans[kMaxOwnerRanks];
  for (int d = 0; d < R; d++) nrec[d] = nans[d] = 0;
  for (int64_t t = c0; t < c1; t++) {
    unsigned seen = 0;
    for (int k = 0; k < K; k++) {
      const int d = owner_of(a.rk, a.phys[t * K + k]);
      nans[d]++;
      if (a.per_slot || !(seen >> d & 1u)) nrec[d]++;
      seen |= 1u << d;
    }
  }
  int brec[kMaxOwnerRanks], bans[kMaxOwnerRanks];
  for (int d = 0; d < R; d++) {
    int tot = 0;
    brec[d] = block_exclusive_scan(nrec[d], scratch, &tot);
    if (tid == 0) rec_off[d] = tot;
    __syncthreads();
    bans[d] = block_exclusive_scan(nans[d], scratch, &tot);
    if (tid == 0) ans_off[d] = tot;
    __syncthreads();
  }
  // Reservation at the destinations (the NVLink backends): one system-scope atomic per destination,
  // in parallel, before the totals below become offsets.
  if (a.reserved && tid < R) {
    const int n_rec = rec_off[tid];
    a.reserved[tid] = n_rec > 0 ? atomicAdd_system(a.reserve_at[tid], n_rec) : 0;
  }
  __syncthreads();
  if (tid == 0) {
    int sr = 0, sa = 0;
    for (int d = 0; d < R; d++) {
      const int cr = rec_off[d], ca = ans_off[d];
      a.counts[d] = cr;
      a.counts[R + d] = ca;
      rec_off[d] = a.fixed > 0 ? d * a.fixed : sr;
      ans_off[d] = a.fixed > 0 ? d * a.fixed : sa;
      sr += cr;
      sa += ca;
    }
  }
  __syncthreads();
  for (int64_t t = c0; t < c1; t++) {
    unsigned seen = 0;
    if (a.rec_pos)
      for (int d = 0; d < R; d++) a.rec_pos[(t - a.t0) * R + d] = -1;
    for (int k = 0; k < K; k++) {
      const int d = owner_of(a.rk, a.phys[t * K + k]);
      const int apos = ans_off[d] + bans[d]++;
      a.slot_pos[(t - a.t0) * K + k] = apos;
      if (a.per_slot || !(seen >> d & 1u)) {
        const int rpos = rec_off[d] + brec[d]++;
        if (a.rec_pos) a.rec_pos[(t - a.t0) * R + d] = rpos;
        if (a.rec_token) {
          a.rec_token[rpos] = int32_t(t);
          a.rec_slot[rpos] = a.per_slot ? k : -1;
          a.rec_dest[rpos] = d;
        }
      }
      seen |= 1u << d;
    }
  }
}

}  // namespace

void home_plan(const HomePlanArgs& a, cudaStream_t s) {
  home_plan_kernel<<<1, kHomeThreads, 0, s>>>(a);
  EPMOE_CUDA_LAUNCHED();
}

}  // namespace epmoe::cuda
