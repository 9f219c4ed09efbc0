// Expert parallelism across GPUs over NCCL: two backends under the contract of ep/backend.h (the
// GPU twins of src/ep/mpi/{none,alltoall,lowlatency}.cc), over the group of comm/nccl_group.h:
//
//   none        all-gather of tokens and routing (ncclAllGather, padded to the largest rank);
//               every rank serves its experts for all tokens; one answer row per served
//               (token, slot) returns home (grouped ncclSend/ncclRecv)
//   alltoall    count exchange, then grouped ncclSend/ncclRecv of records, a token once per
//               destination rank that owns one of its slots (dedup, DeepEP normal mode); answers
//               back the same way
// (lowlatency and onesided write straight into peers' memory over NVLink: ep/nccl/ipc_backends.cu.)
//
// Home side, every backend: the answer of (t, k) lands at slot_pos[t*K + k] of the received
// answers, and combine_slots sums w_k * answer in slot order in fp32 -- the same kernel and the
// same row values as the single-GPU path, hence the same bits. Injected faults
// (BackendOptions::fault, `epmoe check --inject`) act at home through combine_slots_faulty (and, for
// drop-overflow, lowlatency's rounds); the correct path never calls it. `--combine fast` (alltoall):
// records carry the top-k weights, the serving rank returns one fp32 partial per record, home sums
// the partials in rank order.
#include <nccl.h>

#include <algorithm>

#include "comm/nccl_check.cuh"
#include "comm/nccl_group.h"
#include "ep/cuda/plan_combine.cuh"
#include "ep/dispatch_record.h"
#include "ep/nccl/home_plan.cuh"
#include "ep/fault.h"
#include "ep/nccl/nccl_backends.h"

namespace epmoe::cuda {

namespace {

ncclComm_t nc(const NcclGroup& g) { return static_cast<ncclComm_t>(g.nccl_comm()); }

constexpr int kMaxRanks = kMaxOwnerRanks;
using Ranks = OwnerTable;

Ranks ranks_of(const Placement& p) { return owner_table(p); }

// Records (ep/dispatch_record.h): [row: H elements][K int32 physical ids, -1 where the destination
// serves no slot], padded to 16 bytes; no origin (the exchange delivers them in the home plan's
// order). One block per record.
// The fast combine adds the K top-k weights (fp32, 0 where not served) after the ids; an injected
// replica-per-rank fault weighs them by the replica count (replicas: [P], else nullptr).
template <class TA>
__global__ void pack_kernel(const TA* x, DispatchRecordLayout L, const int32_t* phys, Ranks rk, const int32_t* rec_token,
                            const int32_t* rec_slot, const int32_t* rec_dest, unsigned char* out,
                            const float* weights, const int32_t* replicas) {
  const int64_t i = blockIdx.x;
  const int H = L.H, K = L.K;
  unsigned char* rec = out + size_t(i) * L.bytes();
  int32_t* meta = L.physical(rec);
  const int t = rec_token[i];
  if (t < 0) {  // an unused record of a fixed-capacity block
    for (int k = threadIdx.x; k < K; k += blockDim.x) meta[k] = -1;
    return;
  }
  const int d = rec_dest[i], slot = rec_slot[i];
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    const int p = phys[int64_t(t) * K + k];
    const bool served = slot >= 0 ? k == slot : owner_of(rk, p) == d;
    meta[k] = served ? p : -1;
    if (weights) {
      const float w = weights[int64_t(t) * K + k];
      L.weight(rec)[k] = served ? (replicas ? w * float(replicas[p]) : w) : 0.0f;
    }
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

// Shared by the NCCL backends.
class NcclBackendBase : public A2ABackend {
 public:
  NcclBackendBase(NcclGroup& g, const Placement& p, const BackendOptions& o)
      : g_(g),
        rk_(ranks_of(p)),
        fault_(o.fault),
        fast_(o.combine == CombineMode::Fast),
        fc_(make_fault_combine(o.fault, p, g.rank(), replicas_)) {}
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
    if (fast_) {
      rec_pos_.reserve(size_t(std::max<int64_t>(n, 1) * rk_.R));
      a.rec_pos = rec_pos_.data();
    }
    cuda::home_plan(a, stream());
  }

  // A record: the row, K ids and, for the fast combine, K weights; 16-byte aligned.
  DispatchRecordLayout record_layout(const MoeTokens& in) const {
    DispatchRecordLayout L;
    L.H = in.H, L.K = in.K, L.elt = bf16_act(in) ? 2 : 4;
    L.origin = false, L.weights = fast_, L.align = 16;
    return L;
  }

  void pack(const MoeTokens& in, int64_t n_records, const DispatchRecordLayout& L, unsigned char* out) {
    if (n_records == 0) return;
    if (bf16_act(in))
      pack_kernel<bf16><<<unsigned(n_records), 128, 0, stream()>>>(static_cast<const bf16*>(in.x), L, in.physical, rk_,
                                                                   rec_token_.data(), rec_slot_.data(),
                                                                   rec_dest_.data(), out, pack_weights(in),
                                                                   pack_replicas());
    else
      pack_kernel<float><<<unsigned(n_records), 128, 0, stream()>>>(static_cast<const float*>(in.x), L, in.physical,
                                                                    rk_, rec_token_.data(), rec_slot_.data(),
                                                                    rec_dest_.data(), out, pack_weights(in),
                                                                    pack_replicas());
    EPMOE_CUDA_LAUNCHED();
  }

  const float* pack_weights(const MoeTokens& in) const { return fast_ ? in.weights : nullptr; }
  const int32_t* pack_replicas() const { return fault_ == Fault::ReplicaPerRank ? replicas_.data() : nullptr; }

  // The deterministic combine of tokens [t0, t1) from the answers as received (slot_pos_); the
  // faulty twin only when a fault is injected.
  void combine(const MoeTokens& in, const unsigned char* answers, int64_t t0, int64_t t1, float* y) {
    const int64_t n = t1 - t0;
    const float* w = in.weights + t0 * in.K;
    float* yo = y + t0 * in.H;
    if (fault_ != Fault::None) {
      FaultCombine f = fc_;
      f.phys = in.physical + t0 * in.K;
      if (bf16_act(in))
        combine_slots_faulty(reinterpret_cast<const bf16*>(answers), slot_pos_.data(), w, n, in.H, in.K, f, yo, stream());
      else
        combine_slots_faulty(reinterpret_cast<const float*>(answers), slot_pos_.data(), w, n, in.H, in.K, f, yo,
                             stream());
      return;
    }
    if (bf16_act(in))
      combine_slots(reinterpret_cast<const bf16*>(answers), slot_pos_.data(), w, n, in.H, in.K, 1.0f, yo, stream());
    else
      combine_slots(reinterpret_cast<const float*>(answers), slot_pos_.data(), w, n, in.H, in.K, 1.0f, yo, stream());
  }

  // The fast combine at home: fp32 partials, one per record, as received (rec_pos_).
  void combine_fast(const MoeTokens& in, const unsigned char* partials, float* y) {
    FaultCombine f = fc_;
    f.phys = in.physical;
    combine_partials(reinterpret_cast<const float*>(partials), rec_pos_.data(), in.T, rk_.R, in.H,
                     fault_ != Fault::None ? &f : nullptr, y, stream());
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
  Fault fault_;
  bool fast_;                      // CombineMode::Fast
  DeviceArray<int32_t> replicas_;  // (before fc_, which points into it)
  FaultCombine fc_;                // the injected fault, when one is
  DeviceArray<int32_t> slot_pos_, counts_, rec_token_, rec_slot_, rec_dest_, rec_pos_;
  PinnedArray<int32_t> counts_host_;  // counts the host needs to size an exchange
};

// ---------------------------------------------------------------------------------------------
class AllToAllGpu final : public NcclBackendBase {
 public:
  using NcclBackendBase::NcclBackendBase;
  std::string name() const override { return "alltoall"; }
  void run(const MoeTokens& in, ExpertRunner& experts, float* y) override {
    const int R = rk_.R;
    const DispatchRecordLayout L = record_layout(in);
    const size_t elt = size_t(L.elt), row = L.row_bytes(), rec = L.bytes();
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
    // The fast combine returns one fp32 partial per record instead of a row per served slot.
    const size_t ans_row = L.answer_bytes();
    if (fast_) sans = srec, rans = rrec, nans_in = nsend;
    send_.reserve(size_t(std::max<int64_t>(nsend, 1)) * rec);
    recv_.reserve(size_t(std::max<int64_t>(nrecv, 1)) * rec);
    out_.reserve(size_t(std::max<int64_t>(nans_out, 1)) * row);
    back_.reserve(size_t(std::max<int64_t>(nans_in, 1)) * ans_row);
    pack(in, nsend, L, send_.data());
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
    j.phys = L.physical(recv_.data());
    j.phys_stride = int64_t(rec / 4);
    j.rows = nrecv;
    j.K = in.K;
    j.compact = true;
    if (fast_) {
      base_.reserve(size_t(nrecv) + 1);
      j.row_base = base_.data();
    }
    experts.run(j, out_.data());
    const unsigned char* answers = out_.data();
    if (fast_) {
      partial_.reserve(size_t(std::max<int64_t>(nrecv, 1)) * size_t(in.H));
      if (bf16_act(in))
        reduce_partials(recv_.data(), int64_t(rec), int64_t(L.phys_off()), int64_t(L.weight_off()), nrecv, nullptr,
                        base_.data(), reinterpret_cast<const bf16*>(out_.data()), in.H, in.K, partial_.data(), stream());
      else
        reduce_partials(recv_.data(), int64_t(rec), int64_t(L.phys_off()), int64_t(L.weight_off()), nrecv, nullptr,
                        base_.data(), reinterpret_cast<const float*>(out_.data()), in.H, in.K, partial_.data(),
                        stream());
      answers = reinterpret_cast<const unsigned char*>(partial_.data());
    }
    const auto ob = bytes(rans, ans_row), ib = bytes(sans, ans_row);
    exchange(answers, ob, prefix(ob), back_.data(), ib, prefix(ib));
    if (fast_) combine_fast(in, back_.data(), y);
    else combine(in, back_.data(), 0, in.T, y);
  }

 private:
  DeviceArray<unsigned char> send_, recv_, out_, back_;
  DeviceArray<int32_t> base_;
  DeviceArray<float> partial_;
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

}  // namespace

}  // namespace epmoe::cuda

namespace epmoe {

std::unique_ptr<A2ABackend> make_nccl_none_backend(NcclGroup& g, const Placement& p, const BackendOptions& o) {
  return std::make_unique<cuda::NoneGpu>(g, p, o);
}

std::unique_ptr<A2ABackend> make_nccl_alltoall_backend(NcclGroup& g, const Placement& p, const BackendOptions& o) {
  return std::make_unique<cuda::AllToAllGpu>(g, p, o);
}

}  // namespace epmoe
