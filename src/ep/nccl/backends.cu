// Expert parallelism across GPUs over NCCL: three backends under the contract of ep/backend.h (the
// GPU twins of src/ep/mpi/{none,alltoall,lowlatency}.cc), over the group of comm/nccl_group.h:
//
//   none        all-gather of tokens and routing (ncclAllGather, padded to the largest rank);
//               every rank serves its experts for all tokens; one answer row per served
//               (token, slot) returns home (grouped ncclSend/ncclRecv)
//   alltoall    count exchange, then grouped ncclSend/ncclRecv of records, a token once per
//               destination rank that owns one of its slots (dedup, DeepEP normal mode); answers
//               back the same way
//   lowlatency  fixed-capacity buffers allocated once, one record per (token, slot), fixed-size
//               messages (no count exchange, no host synchronisation inside a round); more tokens
//               than the capacity run in further rounds, never dropped
//
// Home side, every backend: the answer of (t, k) lands at slot_pos[t*K + k] of the received
// answers, and combine_slots sums w_k * answer in slot order in fp32 -- the same kernel and the
// same row values as the single-GPU path, hence the same bits. The injected fault the GPU backends
// implement (BackendOptions::fault, `epmoe check --inject`) is double-reduce: the combine's scale
// becomes the group size.
#include <nccl.h>

#include <algorithm>

#include "comm/nccl_check.cuh"
#include "comm/nccl_group.h"
#include "ep/cuda/plan_combine.cuh"
#include "ep/fault.h"
#include "ep/nccl/nccl_backends.h"

namespace epmoe::cuda {

namespace {

ncclComm_t nc(const NcclGroup& g) { return static_cast<ncclComm_t>(g.nccl_comm()); }

constexpr int kMaxRanks = 16;

struct Ranks {
  int R = 1;
  int begin[kMaxRanks + 1] = {};
};

Ranks ranks_of(const Placement& p) {
  EPMOE_ASSERT(p.ranks <= kMaxRanks, "gpu backends: at most 16 ranks");
  Ranks r;
  r.R = p.ranks;
  for (int i = 0; i <= p.ranks; i++) r.begin[i] = p.rank_begin[size_t(i)];
  return r;
}

__device__ inline int owner_of(const Ranks& rk, int phys) {
  int d = 0;
  while (d + 1 < rk.R && rk.begin[d + 1] <= phys) d++;
  // Ranks with an empty range share their begin with the next one: the last such rank wins,
  // as Placement::owner (upper_bound) does.
  return d;
}

// The home side's plan over its tokens [t0, t1): records per destination, and where each slot's
// answer will be in the received answers. One block; per-destination counters per thread.
struct HomePlanArgs {
  Ranks rk;
  const int32_t* phys = nullptr;  // [T, K]
  int64_t t0 = 0, t1 = 0;
  int K = 0;
  bool per_slot = false;  // a record per (token, slot) (else per (token, destination))
  int fixed = 0;          // > 0: the block of destination d starts at d * fixed (bounded capacity)
  int32_t* counts = nullptr;     // [2R]: records to d, answers from d
  int32_t* rec_token = nullptr;  // [records] (nullptr: no records needed)
  int32_t* rec_slot = nullptr;
  int32_t* rec_dest = nullptr;
  int64_t rec_bound = 0;         // fixed mode: rec_* entries to clear to -1 first
  int32_t* slot_pos = nullptr;   // [(t1 - t0) * K]
};

constexpr int kHomeThreads = 1024;

__global__ void __launch_bounds__(kHomeThreads) home_plan_kernel(const HomePlanArgs a) {
  __shared__ int scratch[33];
  __shared__ int rec_off[kMaxRanks], ans_off[kMaxRanks];
  const int tid = threadIdx.x, R = a.rk.R, K = a.K;
  const int64_t n = a.t1 - a.t0;
  const int64_t chunk = (n + kHomeThreads - 1) / kHomeThreads;
  const int64_t c0 = a.t0 + lmin(n, tid * chunk), c1 = a.t0 + lmin(n, (tid + 1) * chunk);
  if (a.fixed > 0 && a.rec_token)
    for (int64_t i = tid; i < a.rec_bound; i += kHomeThreads) a.rec_token[i] = -1;
  int nrec[kMaxRanks], nans[kMaxRanks];
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
  int brec[kMaxRanks], bans[kMaxRanks];
  for (int d = 0; d < R; d++) {
    int tot = 0;
    brec[d] = block_exclusive_scan(nrec[d], scratch, &tot);
    if (tid == 0) rec_off[d] = tot;
    __syncthreads();
    bans[d] = block_exclusive_scan(nans[d], scratch, &tot);
    if (tid == 0) ans_off[d] = tot;
    __syncthreads();
  }
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
    for (int k = 0; k < K; k++) {
      const int d = owner_of(a.rk, a.phys[t * K + k]);
      const int apos = ans_off[d] + bans[d]++;
      a.slot_pos[(t - a.t0) * K + k] = apos;
      if (a.per_slot || !(seen >> d & 1u)) {
        const int rpos = rec_off[d] + brec[d]++;
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

// Records: [row: H elements][K int32 physical ids, -1 where the destination serves no slot],
// padded to 16 bytes. One block per record.
template <class TA>
__global__ void pack_kernel(const TA* x, int H, const int32_t* phys, int K, Ranks rk, const int32_t* rec_token,
                            const int32_t* rec_slot, const int32_t* rec_dest, int64_t rec_bytes, unsigned char* out) {
  const int64_t i = blockIdx.x;
  unsigned char* rec = out + i * rec_bytes;
  int32_t* meta = reinterpret_cast<int32_t*>(rec + int64_t(H) * sizeof(TA));
  const int t = rec_token[i];
  if (t < 0) {  // an unused record of a fixed-capacity block
    for (int k = threadIdx.x; k < K; k += blockDim.x) meta[k] = -1;
    return;
  }
  const int d = rec_dest[i], slot = rec_slot[i];
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    const int p = phys[int64_t(t) * K + k];
    meta[k] = (slot >= 0 ? k == slot : owner_of(rk, p) == d) ? p : -1;
  }
  const uint4* src = reinterpret_cast<const uint4*>(x + int64_t(t) * H);
  uint4* dst = reinterpret_cast<uint4*>(rec);
  const int n16 = int(int64_t(H) * sizeof(TA) / 16);
  for (int q = threadIdx.x; q < n16; q += blockDim.x) dst[q] = src[q];
}

// Pads the phys ids of rows [T, Tmax) with -1 (all-gather of a rank with fewer tokens).
__global__ void fill_i32(int32_t* p, int64_t n, int32_t v) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) p[i] = v;
}

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// Shared by the three backends.
class NcclBackendBase : public A2ABackend {
 public:
  NcclBackendBase(NcclGroup& g, const Placement& p, const BackendOptions& o)
      : g_(g), rk_(ranks_of(p)), scale_(fault_output_scale(o.fault, p)) {}
  Device device() const override { return Device::Cuda; }

 protected:
  void home_plan(const MoeTokens& in, int64_t t0, int64_t t1, bool per_slot, int fixed, bool records) {
    const int64_t n = t1 - t0;
    slot_pos_.reserve(size_t(std::max<int64_t>(n, 1) * in.K));
    counts_.reserve(size_t(4 * kMaxRanks));
    const int64_t bound = fixed > 0 ? int64_t(fixed) * rk_.R : std::max<int64_t>(n, 1) * in.K;
    if (records) {
      rec_token_.reserve(size_t(bound));
      rec_slot_.reserve(size_t(bound));
      rec_dest_.reserve(size_t(bound));
    }
    HomePlanArgs a;
    a.rk = rk_;
    a.phys = in.physical;
    a.t0 = t0;
    a.t1 = t1;
    a.K = in.K;
    a.per_slot = per_slot;
    a.fixed = fixed;
    a.counts = counts_.data();
    a.rec_token = records ? rec_token_.data() : nullptr;
    a.rec_slot = records ? rec_slot_.data() : nullptr;
    a.rec_dest = records ? rec_dest_.data() : nullptr;
    a.rec_bound = bound;
    a.slot_pos = slot_pos_.data();
    home_plan_kernel<<<1, kHomeThreads, 0, stream()>>>(a);
    EPMOE_CUDA_LAUNCHED();
  }

  void pack(const MoeTokens& in, int64_t n_records, size_t rec_bytes, unsigned char* out) {
    if (n_records == 0) return;
    if (bf16_act(in))
      pack_kernel<bf16><<<unsigned(n_records), 128, 0, stream()>>>(static_cast<const bf16*>(in.x), in.H, in.physical,
                                                                   in.K, rk_, rec_token_.data(), rec_slot_.data(),
                                                                   rec_dest_.data(), int64_t(rec_bytes), out);
    else
      pack_kernel<float><<<unsigned(n_records), 128, 0, stream()>>>(static_cast<const float*>(in.x), in.H, in.physical,
                                                                    in.K, rk_, rec_token_.data(), rec_slot_.data(),
                                                                    rec_dest_.data(), int64_t(rec_bytes), out);
    EPMOE_CUDA_LAUNCHED();
  }

  void combine(const MoeTokens& in, const unsigned char* answers, int64_t t0, int64_t t1, float* y) {
    const int64_t n = t1 - t0;
    const float scale = scale_;
    if (bf16_act(in))
      combine_slots(reinterpret_cast<const bf16*>(answers), slot_pos_.data(), in.weights + t0 * in.K, n, in.H, in.K,
                    scale, y + t0 * in.H, stream());
    else
      combine_slots(reinterpret_cast<const float*>(answers), slot_pos_.data(), in.weights + t0 * in.K, n, in.H, in.K,
                    scale, y + t0 * in.H, stream());
  }

  // Grouped point-to-point exchange: send[d] bytes at send + soff[d], recv[s] bytes at recv + roff[s].
  void exchange(const unsigned char* send, const std::vector<size_t>& sbytes, const std::vector<size_t>& soff,
                unsigned char* recv, const std::vector<size_t>& rbytes, const std::vector<size_t>& roff) {
    EPMOE_NCCL_CHECK(ncclGroupStart());
    for (int d = 0; d < rk_.R; d++) {
      if (sbytes[size_t(d)])
        EPMOE_NCCL_CHECK(ncclSend(send + soff[size_t(d)], sbytes[size_t(d)], ncclChar, d, nc(g_), stream()));
      if (rbytes[size_t(d)])
        EPMOE_NCCL_CHECK(ncclRecv(recv + roff[size_t(d)], rbytes[size_t(d)], ncclChar, d, nc(g_), stream()));
      if (d != g_.rank()) g_.add_bytes_sent(sbytes[size_t(d)]);
    }
    EPMOE_NCCL_CHECK(ncclGroupEnd());
  }

  static std::vector<size_t> prefix(const std::vector<size_t>& v) {
    std::vector<size_t> o(v.size(), 0);
    for (size_t i = 1; i < v.size(); i++) o[i] = o[i - 1] + v[i - 1];
    return o;
  }

  static bool bf16_act(const MoeTokens& in) { return in.act == DType::BF16; }

  NcclGroup& g_;
  Ranks rk_;
  float scale_;  // of the combine: 1, or the group size under an injected double reduce
  DeviceArray<int32_t> slot_pos_, counts_, rec_token_, rec_slot_, rec_dest_;
  PinnedArray<int32_t> counts_host_;  // counts the host needs to size an exchange
};

// ---------------------------------------------------------------------------------------------
class AllToAllGpu final : public NcclBackendBase {
 public:
  using NcclBackendBase::NcclBackendBase;
  std::string name() const override { return "alltoall"; }
  void run(const MoeTokens& in, ExpertRunner& experts, float* y) override {
    const int R = rk_.R;
    const size_t elt = bf16_act(in) ? 2 : 4, row = size_t(in.H) * elt;
    const size_t rec = align16(row + size_t(in.K) * 4);
    home_plan(in, 0, in.T, /*per_slot=*/false, /*fixed=*/0, /*records=*/true);
    // Counts: to d (records to d, answers I expect from d); from s the same pair. Two messages
    // per peer, matched in order (NCCL keeps the order of operations between a pair).
    int32_t* c = counts_.data();
    EPMOE_NCCL_CHECK(ncclGroupStart());
    for (int d = 0; d < R; d++) {
      EPMOE_NCCL_CHECK(ncclSend(c + d, 1, ncclInt32, d, nc(g_), stream()));
      EPMOE_NCCL_CHECK(ncclSend(c + R + d, 1, ncclInt32, d, nc(g_), stream()));
      EPMOE_NCCL_CHECK(ncclRecv(c + 2 * R + d, 1, ncclInt32, d, nc(g_), stream()));
      EPMOE_NCCL_CHECK(ncclRecv(c + 3 * R + d, 1, ncclInt32, d, nc(g_), stream()));
    }
    EPMOE_NCCL_CHECK(ncclGroupEnd());
    // Into page-locked memory: the copy does not block, the group's sync() waits (with a deadline).
    PinnedArray<int32_t>& h = counts_host_;
    h.reserve(size_t(4 * R));
    EPMOE_CUDA_CHECK(cudaMemcpyAsync(h.data(), c, sizeof(int32_t) * size_t(4 * R), cudaMemcpyDeviceToHost, stream()));
    g_.sync("alltoall counts");
    std::vector<size_t> srec(static_cast<size_t>(R)), sans(static_cast<size_t>(R)), rrec(static_cast<size_t>(R)), rans(static_cast<size_t>(R));
    int64_t nsend = 0, nrecv = 0, nans_out = 0, nans_in = 0;
    for (int d = 0; d < R; d++) {
      srec[size_t(d)] = size_t(h[size_t(d)]);
      sans[size_t(d)] = size_t(h[size_t(R + d)]);
      rrec[size_t(d)] = size_t(h[size_t(2 * R + d)]);
      rans[size_t(d)] = size_t(h[size_t(3 * R + d)]);
      nsend += int64_t(srec[size_t(d)]);
      nrecv += int64_t(rrec[size_t(d)]);
      nans_in += int64_t(sans[size_t(d)]);
      nans_out += int64_t(rans[size_t(d)]);
    }
    send_.reserve(size_t(std::max<int64_t>(nsend, 1)) * rec);
    recv_.reserve(size_t(std::max<int64_t>(nrecv, 1)) * rec);
    out_.reserve(size_t(std::max<int64_t>(nans_out, 1)) * row);
    back_.reserve(size_t(std::max<int64_t>(nans_in, 1)) * row);
    pack(in, nsend, rec, send_.data());
    auto bytes = [](const std::vector<size_t>& n, size_t b) {
      std::vector<size_t> o(n.size());
      for (size_t i = 0; i < n.size(); i++) o[i] = n[i] * b;
      return o;
    };
    const auto sb = bytes(srec, rec), rb = bytes(rrec, rec);
    exchange(send_.data(), sb, prefix(sb), recv_.data(), rb, prefix(rb));
    ExpertJobs j;
    j.x = recv_.data();
    j.x_stride = int64_t(rec / elt);
    j.phys = reinterpret_cast<const int32_t*>(recv_.data() + row);
    j.phys_stride = int64_t(rec / 4);
    j.rows = nrecv;
    j.K = in.K;
    j.compact = true;
    experts.run(j, out_.data());
    const auto ob = bytes(rans, row), ib = bytes(sans, row);
    exchange(out_.data(), ob, prefix(ob), back_.data(), ib, prefix(ib));
    combine(in, back_.data(), 0, in.T, y);
  }

 private:
  DeviceArray<unsigned char> send_, recv_, out_, back_;
};

// ---------------------------------------------------------------------------------------------
class NoneGpu final : public NcclBackendBase {
 public:
  using NcclBackendBase::NcclBackendBase;
  std::string name() const override { return "none"; }
  void run(const MoeTokens& in, ExpertRunner& experts, float* y) override {
    const int R = rk_.R;
    const size_t elt = bf16_act(in) ? 2 : 4, row = size_t(in.H) * elt;
    const std::vector<int64_t> Ts = g_.allgather_i64(in.T);
    const int64_t Tmax = *std::max_element(Ts.begin(), Ts.end());
    if (Tmax == 0) return;
    home_plan(in, 0, in.T, false, 0, /*records=*/false);
    xl_.reserve(size_t(Tmax) * row);
    pl_.reserve(size_t(Tmax) * size_t(in.K));
    xa_.reserve(size_t(Tmax) * size_t(R) * row);
    pa_.reserve(size_t(Tmax) * size_t(R) * size_t(in.K));
    base_.reserve(size_t(Tmax) * size_t(R) + 1);
    cudaStream_t s = stream();
    if (in.T) EPMOE_CUDA_CHECK(cudaMemcpyAsync(xl_.data(), in.x, size_t(in.T) * row, cudaMemcpyDeviceToDevice, s));
    fill_i32<<<64, 256, 0, s>>>(pl_.data(), Tmax * in.K, -1);
    EPMOE_CUDA_LAUNCHED();
    if (in.T)
      EPMOE_CUDA_CHECK(cudaMemcpyAsync(pl_.data(), in.physical, size_t(in.T * in.K) * 4, cudaMemcpyDeviceToDevice, s));
    EPMOE_NCCL_CHECK(ncclGroupStart());
    EPMOE_NCCL_CHECK(ncclAllGather(xl_.data(), xa_.data(), size_t(Tmax) * row, ncclChar, nc(g_), s));
    EPMOE_NCCL_CHECK(ncclAllGather(pl_.data(), pa_.data(), size_t(Tmax * in.K), ncclInt32, nc(g_), s));
    EPMOE_NCCL_CHECK(ncclGroupEnd());
    g_.add_bytes_sent(uint64_t(R - 1) * (size_t(Tmax) * row + size_t(Tmax * in.K) * 4));
    ExpertJobs j;
    j.x = xa_.data();
    j.x_stride = in.H;
    j.phys = pa_.data();
    j.phys_stride = in.K;
    j.rows = Tmax * R;
    j.K = in.K;
    j.compact = true;
    j.row_base = base_.data();
    out_.reserve(size_t(Tmax) * size_t(R) * size_t(in.K) * row);
    experts.run(j, out_.data());
    // Answers to source s: the compact range of its rows. Into page-locked memory: the copies do
    // not block, the group's sync() waits (with a deadline).
    counts_host_.reserve(size_t(3 * R + 1));
    int32_t* b = counts_host_.data();  // [R + 1] row bases
    int32_t* cnt = b + R + 1;          // [2R] counts of the home plan
    for (int q = 0; q <= R; q++)
      EPMOE_CUDA_CHECK(cudaMemcpyAsync(&b[size_t(q)], base_.data() + q * Tmax, 4, cudaMemcpyDeviceToHost, s));
    EPMOE_CUDA_CHECK(cudaMemcpyAsync(cnt, counts_.data(), sizeof(int32_t) * size_t(2 * R), cudaMemcpyDeviceToHost, s));
    g_.sync("none: answer counts");
    std::vector<size_t> ob(static_cast<size_t>(R)), oo(static_cast<size_t>(R)), ib(static_cast<size_t>(R));
    size_t nin = 0;
    for (int q = 0; q < R; q++) {
      ob[size_t(q)] = size_t(b[size_t(q) + 1] - b[size_t(q)]) * row;
      oo[size_t(q)] = size_t(b[size_t(q)]) * row;
      ib[size_t(q)] = size_t(cnt[size_t(R + q)]) * row;
      nin += size_t(cnt[size_t(R + q)]);
    }
    back_.reserve(std::max<size_t>(nin, 1) * row);
    exchange(out_.data(), ob, oo, back_.data(), ib, prefix(ib));
    combine(in, back_.data(), 0, in.T, y);
  }

 private:
  DeviceArray<unsigned char> xl_, xa_, out_, back_;
  DeviceArray<int32_t> pl_, pa_, base_;
};

// ---------------------------------------------------------------------------------------------
class LowLatencyGpu final : public NcclBackendBase {
 public:
  LowLatencyGpu(NcclGroup& g, const Placement& p, const BackendOptions& o)
      : NcclBackendBase(g, p, o), cap_(o.max_dispatch_tokens_per_rank) {}
  std::string name() const override { return "lowlatency"; }
  void run(const MoeTokens& in, ExpertRunner& experts, float* y) override {
    const int R = rk_.R;
    const size_t elt = bf16_act(in) ? 2 : 4, row = size_t(in.H) * elt;
    const size_t rec = align16(row + size_t(in.K) * 4);
    const int block = cap_ * in.K;  // records (= answers) per destination per round
    // Buffers of a fixed size, allocated on first use and kept.
    send_.reserve(size_t(block) * size_t(R) * rec);
    recv_.reserve(size_t(block) * size_t(R) * rec);
    out_.reserve(size_t(block) * size_t(R) * row);
    back_.reserve(size_t(block) * size_t(R) * row);
    const int64_t rounds = g_.allreduce_max((in.T + cap_ - 1) / cap_);
    const std::vector<size_t> rb(size_t(R), size_t(block) * rec), ab(size_t(R), size_t(block) * row);
    for (int64_t r = 0; r < rounds; r++) {
      const int64_t t0 = std::min<int64_t>(in.T, r * cap_), t1 = std::min<int64_t>(in.T, t0 + cap_);
      home_plan(in, t0, t1, /*per_slot=*/true, block, /*records=*/true);
      pack(in, int64_t(block) * R, rec, send_.data());
      exchange(send_.data(), rb, prefix(rb), recv_.data(), rb, prefix(rb));
      ExpertJobs j;
      j.x = recv_.data();
      j.x_stride = int64_t(rec / elt);
      j.phys = reinterpret_cast<const int32_t*>(recv_.data() + row);
      j.phys_stride = int64_t(rec / 4);
      j.rows = int64_t(block) * R;
      j.K = in.K;
      j.one_per_row = true;
      experts.run(j, out_.data());
      exchange(out_.data(), ab, prefix(ab), back_.data(), ab, prefix(ab));
      combine(in, back_.data(), t0, t1, y);
    }
  }

 private:
  int cap_;
  DeviceArray<unsigned char> send_, recv_, out_, back_;
};

}  // namespace

}  // namespace epmoe::cuda

namespace epmoe {

std::unique_ptr<A2ABackend> make_nccl_none_backend(NcclGroup& g, const Placement& p, const BackendOptions& o) {
  return std::make_unique<cuda::NoneGpu>(g, p, o);
}

std::unique_ptr<A2ABackend> make_nccl_alltoall_backend(NcclGroup& g, const Placement& p, const BackendOptions& o) {
  return std::make_unique<cuda::AllToAllGpu>(g, p, o);
}

std::unique_ptr<A2ABackend> make_nccl_lowlatency_backend(NcclGroup& g, const Placement& p, const BackendOptions& o) {
  return std::make_unique<cuda::LowLatencyGpu>(g, p, o);
}

}  // namespace epmoe
