// onesided and lowlatency on GPUs: every rank's receive buffers mapped into every process (ep/cuda/ipc_window.cuh),
// and kernels that write straight into them over NVLink -- the shape of DeepEP's intranode mode and
// of MoRI, the GPU twin of src/ep/mpi/onesided.cc (MPI-3 RMA). No NCCL call on the hot path.
//
// One call (one epoch e):
//   1. home plan (dedup: a record per (token, destination rank), as alltoall)
//   2. reserve (in the plan's kernel): one device atomic add per destination on its counter of the
//      epoch's slot -> where this rank's records start in the destination's receive region
//   3. put: the records written into the destinations' regions; the last block sets this rank's
//      dispatch flag at every peer to e (release, system scope)
//   4. wait for every source's dispatch flag; the received count is the counter's value
//   5. experts over the received records, read in place (the count stays on the device)
//   6. answers written straight to their final place at home: the row of (token, k) at
//      token * K + k (deterministic) or one fp32 partial at token * R + me (fast); then the
//      combine flag
//   7. wait for every source's combine flag; the slot-order combine of every GPU backend
//      (deterministic: the same kernel and rows as one GPU, hence the same bits)
// Records land in a racy order; each carries its token and source, and the experts are
// batch-invariant, so the order changes no bit.
//
// Capacity: every rank's window holds R * C records and C tokens' answers, C the most tokens any
// rank has in a call. Unless the caller promised a bound (BackendOptions::max_tokens_per_rank),
// the ranks agree on C each call (one allreduce of T); a larger C grows every window together.
#include <algorithm>
#include <cstddef>

#include "comm/group.h"
#include "ep/cuda/ipc_window.cuh"
#include "ep/cuda/plan_combine.cuh"
#include "ep/dispatch_record.h"
#include "ep/fault.h"
#include "ep/nccl/home_plan.cuh"
#include "ep/nccl/nccl_backends.h"

namespace epmoe::cuda {

namespace {

constexpr int kDispatch = 0, kCombine = 1;  // IpcSignals::flag stages

// A record (ep/dispatch_record.h): [row][K int32 physical ids, -1 where not served][token][source]
// [K fp32 weights: fast combine only], 16-byte aligned. Records land in a racy order, so each names
// its origin.
DispatchRecordLayout record_layout(const MoeTokens& in, bool fast) {
  DispatchRecordLayout L;
  L.H = in.H, L.K = in.K, L.elt = in.act == DType::BF16 ? 2 : 4;
  L.origin = true, L.weights = fast, L.align = 16;
  return L;
}

struct PutArgs {
  IpcPeers peers;
  OwnerTable rk;
  int me = 0;
  IpcEpoch epoch;       // the dispatch advances a device-kept epoch
  size_t recv_off = 0;  // region of received records in every window
  const int32_t* counts = nullptr;     // [R] records to each destination (home plan)
  const int32_t* base = nullptr;       // [R] reserved first slot at each destination
  const int32_t* rec_token = nullptr;  // records in destination order
  const int32_t* rec_slot = nullptr;   // the slot of a per-slot record, else -1
  const int32_t* rec_dest = nullptr;
  int64_t t0 = 0;                      // first token of the round (answers are numbered from it)
  const int32_t* phys = nullptr;       // [T, K]
  const float* weights = nullptr;      // [T, K], fast combine only
  const int32_t* replicas = nullptr;   // injected replica-per-rank only
  const void* x = nullptr;
  DispatchRecordLayout L;
  unsigned* blocks_done = nullptr;
};

__global__ void __launch_bounds__(256) put_kernel(const PutArgs a) {
  const int R = a.rk.R, K = a.L.K;
  __shared__ int first[kMaxOwnerRanks + 1];
  if (threadIdx.x == 0) {
    int run = 0;
    for (int d = 0; d < R; d++) first[d] = run, run += a.counts[d];
    first[R] = run;
  }
  __syncthreads();
  const int total = first[R];
  const size_t rb = a.L.bytes();
  for (int i = blockIdx.x; i < total; i += gridDim.x) {
    const int d = a.rec_dest[i], t = a.rec_token[i], slot = a.rec_slot[i];
    unsigned char* rec = a.peers.base[d] + a.recv_off + size_t(a.base[d] + i - first[d]) * rb;
    int32_t* ids = a.L.physical(rec);
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
      const int p = a.phys[int64_t(t) * K + k];
      const bool served = slot >= 0 ? k == slot : owner_of(a.rk, p) == d;
      ids[k] = served ? p : -1;
      if (a.L.weights) {  // the fast combine: the serving rank weighs
        const float w = a.weights[int64_t(t) * K + k];
        a.L.weight(rec)[k] = served ? (a.replicas ? w * float(a.replicas[p]) : w) : 0.f;
      }
    }
    if (threadIdx.x == 0) a.L.set_origin(rec, int32_t(t - a.t0), a.me);
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(a.x) + size_t(t) * a.L.row_bytes());
    uint4* dst = reinterpret_cast<uint4*>(rec);
    const int n16 = int(a.L.row_bytes() / 16);
    for (int q = threadIdx.x; q < n16; q += blockDim.x) dst[q] = src[q];
  }
  ipc_grid_done_signal(a.peers, R, a.me, kDispatch, a.epoch, /*advance=*/true, a.blocks_done);
}

struct AnswerArgs {
  IpcPeers peers;
  int R = 0, me = 0;
  IpcEpoch epoch;
  size_t answer_off = 0;  // region of answers in every window
  const unsigned char* recv = nullptr;
  const int32_t* count = nullptr;  // received records (device)
  const int32_t* row_base = nullptr;
  const unsigned char* out = nullptr;  // compact expert outputs (activation type)
  DispatchRecordLayout L;
  unsigned* blocks_done = nullptr;
};

// One block per received record: its answers go home, straight to their final rows.
template <class TA>
__global__ void __launch_bounds__(256) answer_kernel(const AnswerArgs a) {
  const int n = *a.count, K = a.L.K, H = a.L.H;
  const size_t rb = a.L.bytes();
  for (int i = blockIdx.x; i < n; i += gridDim.x) {
    const unsigned char* rec = a.recv + size_t(i) * rb;
    const int32_t* ids = a.L.physical(rec);
    const int t = a.L.token(rec);
    const int src = a.L.source(rec);
    unsigned char* home = a.peers.base[src] + a.answer_off;
    const TA* out = reinterpret_cast<const TA*>(a.out);
    int64_t j = a.row_base[i];
    if (!a.L.weights) {  // deterministic: a row per served slot
      const int n16 = int(a.L.row_bytes() / 16);
      for (int k = 0; k < K; k++) {
        if (ids[k] < 0) continue;
        const uint4* s = reinterpret_cast<const uint4*>(out + j * H);
        uint4* d = reinterpret_cast<uint4*>(home + (size_t(t) * K + k) * a.L.row_bytes());
        for (int q = threadIdx.x; q < n16; q += blockDim.x) d[q] = s[q];
        j++;
      }
    } else {
      const float* w = a.L.weight(rec);
      float* d = reinterpret_cast<float*>(home + (size_t(t) * a.R + a.me) * size_t(H) * 4);
      for (int h = threadIdx.x; h < H; h += blockDim.x) {
        float acc = 0.f;
        int64_t jj = j;
        for (int k = 0; k < K; k++)
          if (ids[k] >= 0) acc += w[k] * to_f32(out[jj++ * H + h]);
        d[h] = acc;
      }
    }
  }
  ipc_grid_done_signal(a.peers, a.R, a.me, kCombine, a.epoch, /*advance=*/false, a.blocks_done);
}

// Fast combine at home: where the partial of (t, d) is (t * R + d), or -1 when d serves none of
// t's slots -- from the home plan's record map.
__global__ void partial_positions_kernel(const int32_t* rec_pos, int64_t T, int R, int32_t* pos) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < T * R; i += int64_t(gridDim.x) * blockDim.x)
    pos[i] = rec_pos[i] >= 0 ? int32_t(i) : -1;
}

enum class IpcMode {
  OneSided,    // a record per (token, rank); capacity for every token of the call
  LowLatency,  // a record per (token, slot); a fixed capacity per round, further rounds
  Fused,       // chunks pipelined over two streams: dispatch of i+1 and combine of i-1 overlap experts of i
};

// The three GPU backends that write into peers' memory. Every window has two slots (recv and
// answer regions, and reservation counters): epoch e uses slot e & 1, so that the fused pipeline
// can have a chunk in flight while the next one is dispatched. Slot reuse is safe for every mode:
// a source dispatches epoch e + 2 only after its combine of e (answers of e from everybody, which
// each rank sends after it has read its records of e; the fused pipeline orders them on its comm
// stream).
class IpcBackend final : public A2ABackend {
 public:
  IpcBackend(Group& g, int32_t* fault_word, const Placement& p, const BackendOptions& o, IpcMode mode)
      : g_(g),
        win_(g, fault_word),
        mode_(mode),
        fault_(o.fault),
        fast_(o.combine == CombineMode::Fast),
        bound_(o.max_tokens_per_rank),
        round_cap_(mode == IpcMode::Fused ? o.chunk_tokens : o.max_dispatch_tokens_per_rank) {
    EPMOE_ASSERT(mode_ == IpcMode::OneSided || !fast_, "the fast combine on gpus: alltoall and onesided only");
    EPMOE_ASSERT(mode_ == IpcMode::OneSided || round_cap_ > 0, name() + ": a capacity of at least one token");
    rk_ = owner_table(p);
    fc_ = make_fault_combine(fault_, p, g.rank(), replicas_);
    done_.reserve(2);
    EPMOE_CUDA_CHECK(cudaMemset(done_.data(), 0, 2 * sizeof(unsigned)));
  }
  ~IpcBackend() override {
    if (comm_) cudaStreamDestroy(comm_);
    if (ev_in_) cudaEventDestroy(ev_in_);
    if (ev_out_) cudaEventDestroy(ev_out_);
  }
  std::string name() const override {
    switch (mode_) {
      case IpcMode::OneSided: return "onesided";
      case IpcMode::LowLatency: return "lowlatency";
      case IpcMode::Fused: return "fused";
    }
    return "?";
  }
  Device device() const override { return Device::Cuda; }
  // Under a promised bound that fits one round, a call waits on no host and sizes nothing: a CUDA
  // graph can capture and replay it (its epoch lives on the device). The fused pipeline's two
  // streams and host-kept epochs cannot be.
  bool graph_capturable() const override {
    return bound_ > 0 && (mode_ == IpcMode::OneSided || (mode_ == IpcMode::LowLatency && bound_ <= round_cap_));
  }

  void run(const MoeTokens& in, ExpertRunner& experts, float* y) override {
    const DispatchRecordLayout L = record_layout(in, fast_);
    EPMOE_ASSERT(L.row_bytes() % 16 == 0, name() + " on gpus: rows of a multiple of 16 bytes");
    cudaStream_t s = stream();
    if (mode_ == IpcMode::OneSided) {
      ensure_window(L, agreed_tokens(in));
      const Round r = sequential_round(0, in.T);
      dispatch(in, r, L, s);
      serve(r, L, experts);
      finish(in, r, L, y, s);
      return;
    }
    // Rounds of C tokens (lowlatency: the capacity; fused: a chunk); the ranks agree on their
    // number, unless a promised bound fits in one round. (A bound of several rounds would fix
    // their number at the worst case: a decode step of a few tokens would pay for all of them.)
    const int64_t C = round_cap_;
    ensure_window(L, C);
    int64_t rounds;
    if (bound_ > 0 && bound_ <= C) {
      check_bound(in);
      rounds = 1;
    } else {
      rounds = g_.allreduce_max((in.T + C - 1) / C);
    }
    if (fault_drops_overflow(fault_) && mode_ == IpcMode::LowLatency && rounds > 1) {
      // The injected bug class (ep/fault.h): one round only; tokens beyond the capacity silently
      // get no expert output.
      rounds = 1;
      if (in.T > C) EPMOE_CUDA_CHECK(cudaMemsetAsync(y + C * in.H, 0, size_t(in.T - C) * size_t(in.H) * 4, s));
    }
    std::vector<Round> rs;
    for (int64_t r = 0; r < rounds; r++) {
      const int64_t t0 = std::min(in.T, r * C), t1 = std::min(in.T, t0 + C);
      if (mode_ == IpcMode::Fused) {
        const uint64_t e = win_.next_epoch();
        rs.push_back({IpcEpoch{e, nullptr}, int(e & 1), t0, t1});
      } else {
        rs.push_back(sequential_round(t0, t1));
      }
    }
    if (mode_ == IpcMode::LowLatency || rounds == 1) {
      for (const Round& r : rs) {
        dispatch(in, r, L, s);
        serve(r, L, experts);
        finish(in, r, L, y, s);
      }
      return;
    }
    // fused: the comm stream dispatches and combines, the process stream serves. The comm stream
    // runs dispatch(0), dispatch(1), then for each i: finish(i), dispatch(i + 2); the process
    // stream serve(0), serve(1), ... Each wait is on flags, so the two streams need no event
    // between them except at the ends.
    ensure_streams();
    EPMOE_CUDA_CHECK(cudaEventRecord(ev_in_, s));
    EPMOE_CUDA_CHECK(cudaStreamWaitEvent(comm_, ev_in_, 0));
    for (size_t i = 0; i < rs.size() && i < 2; i++) dispatch(in, rs[i], L, comm_);
    for (size_t i = 0; i < rs.size(); i++) {
      serve(rs[i], L, experts);
      finish(in, rs[i], L, y, comm_);
      if (i + 2 < rs.size()) dispatch(in, rs[i + 2], L, comm_);
    }
    EPMOE_CUDA_CHECK(cudaEventRecord(ev_out_, comm_));
    EPMOE_CUDA_CHECK(cudaStreamWaitEvent(s, ev_out_, 0));
  }

 private:
  // One epoch of the exchange. Calls one after the other (onesided, lowlatency) use slot 0 and keep
  // the epoch on the device, so that a CUDA graph can replay them; the fused pipeline has two
  // epochs in flight, slot e & 1, and keeps the epoch on the host.
  struct Round {
    IpcEpoch epoch;
    int slot;
    int64_t t0, t1;
  };
  Round sequential_round(int64_t t0, int64_t t1) const { return {IpcEpoch{0, win_.device_epoch()}, 0, t0, t1}; }
  // The home plan of one round, kept until its combine (the fused pipeline plans the next round
  // before it combines this one): one set per slot.
  struct HomeArrays {
    DeviceArray<int32_t> counts, base, slot_pos, rec_token, rec_slot, rec_dest, rec_pos, pos;
  };

  bool per_slot() const { return mode_ == IpcMode::LowLatency; }
  void check_bound(const MoeTokens& in) const {
    if (in.T > bound_)
      throw Error(name() + ": " + std::to_string(in.T) + " tokens on rank " + std::to_string(g_.rank()) +
                  ", more than the promised bound of " + std::to_string(bound_) + " per rank");
  }
  // onesided: the most tokens any rank has in this call (the promised bound, or agreed now).
  int64_t agreed_tokens(const MoeTokens& in) {
    if (bound_ > 0) {
      check_bound(in);
      return bound_;
    }
    return g_.allreduce_max(in.T);
  }
  void ensure_streams() {
    if (comm_) return;
    EPMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
    EPMOE_CUDA_CHECK(cudaEventCreateWithFlags(&ev_in_, cudaEventDisableTiming));
    EPMOE_CUDA_CHECK(cudaEventCreateWithFlags(&ev_out_, cudaEventDisableTiming));
  }

  // The window holds, per slot, C tokens of every rank: R * C records (R * C * K with a record per
  // slot) and C tokens' answers. It only grows, and every rank grows it together (same C).
  void ensure_window(const DispatchRecordLayout& L, int64_t C) {
    if (win_.allocated() && C <= cap_ && L.bytes() == layout_rec_ && L.answer_bytes() == layout_ans_) return;
    cap_ = mode_ != IpcMode::OneSided || bound_ > 0 ? std::max<int64_t>(C, 1) : std::max<int64_t>({C, 2 * cap_, 64});
    layout_rec_ = L.bytes();
    layout_ans_ = L.answer_bytes();
    const size_t ans_rows = fast_ ? size_t(rk_.R) : size_t(L.K);
    const size_t recv = recv_capacity(L) * L.bytes(), ans = size_t(cap_) * ans_rows * L.answer_bytes();
    win_.allocate(IpcLayout({recv, recv, ans, ans}));
  }
  size_t recv_capacity(const DispatchRecordLayout& L) const {
    return size_t(rk_.R) * size_t(cap_) * (per_slot() ? size_t(L.K) : 1);
  }
  size_t recv_off(int slot) const { return win_.layout().offsets[size_t(slot)]; }
  size_t answer_off(int slot) const { return win_.layout().offsets[2 + size_t(slot)]; }

  // 1-3. Plan, reserve, put: this rank's tokens of the round into the destinations' slot.
  void dispatch(const MoeTokens& in, const Round& r, const DispatchRecordLayout& L, cudaStream_t s) {
    const int R = rk_.R, K = in.K;
    const int64_t n = r.t1 - r.t0;
    HomeArrays& a = home_[r.slot];
    const int64_t rec_bound = std::max<int64_t>(n, 1) * (per_slot() ? K : std::min(R, K));
    a.counts.reserve(2 * size_t(R));
    a.base.reserve(size_t(R));
    a.slot_pos.reserve(size_t(std::max<int64_t>(n, 1) * K));
    a.rec_token.reserve(size_t(rec_bound));
    a.rec_slot.reserve(size_t(rec_bound));
    a.rec_dest.reserve(size_t(rec_bound));
    if (fast_) a.rec_pos.reserve(size_t(std::max<int64_t>(n, 1) * R));
    HomePlanArgs hp;
    hp.rk = rk_;
    hp.phys = in.physical;
    hp.t0 = r.t0, hp.t1 = r.t1, hp.K = K;
    hp.per_slot = per_slot();
    hp.counts = a.counts.data();
    hp.rec_token = a.rec_token.data(), hp.rec_slot = a.rec_slot.data(), hp.rec_dest = a.rec_dest.data();
    hp.rec_bound = rec_bound;
    hp.slot_pos = a.slot_pos.data();
    hp.rec_pos = fast_ ? a.rec_pos.data() : nullptr;
    for (int d = 0; d < R; d++)
      hp.reserve_at[d] = reinterpret_cast<int32_t*>(win_.peers().base[d] + offsetof(IpcSignals, counter)) + r.slot;
    hp.reserved = a.base.data();
    home_plan(hp, s);
    PutArgs pa;
    pa.peers = win_.peers();
    pa.rk = rk_;
    pa.me = g_.rank();
    pa.epoch = r.epoch;
    pa.recv_off = recv_off(r.slot);
    pa.counts = a.counts.data();
    pa.base = a.base.data();
    pa.rec_token = a.rec_token.data();
    pa.rec_slot = a.rec_slot.data();
    pa.rec_dest = a.rec_dest.data();
    pa.t0 = r.t0;
    pa.phys = in.physical;
    pa.weights = in.weights;
    pa.replicas = fault_ == Fault::ReplicaPerRank ? replicas_.data() : nullptr;
    pa.x = in.x;
    pa.L = L;
    pa.blocks_done = done_.data();
    put_kernel<<<unsigned(std::clamp<int64_t>(rec_bound, 1, 4 * sm_count())), 256, 0, s>>>(pa);
    EPMOE_CUDA_LAUNCHED();
    // (Bytes to other ranks are known on the device only: the group's traffic counter does not
    // see these backends.)
  }

  // 4-6. On the process stream (the experts run there): wait for every source, serve what arrived,
  // write the answers home.
  void serve(const Round& r, const DispatchRecordLayout& L, ExpertRunner& experts) {
    cudaStream_t s = stream();
    const int R = rk_.R, K = L.K;
    const int64_t recv_cap = int64_t(recv_capacity(L));
    recv_count_.reserve(1);
    ipc_wait(win_, R, kDispatch, r.epoch, r.slot, recv_count_.data(), int32_t(recv_cap), s);
    row_base_.reserve(size_t(recv_cap) + 1);
    out_.reserve(size_t(recv_cap) * size_t(per_slot() ? 1 : K) * L.row_bytes());
    ExpertJobs j;
    unsigned char* recv = win_.mine() + recv_off(r.slot);
    j.x = recv;
    j.x_stride = int64_t(L.bytes() / L.elt);
    j.phys = L.physical(recv);
    j.phys_stride = int64_t(L.bytes() / 4);
    j.rows = recv_cap;
    j.rows_dev = recv_count_.data();
    j.K = K;
    j.compact = true;
    j.row_base = row_base_.data();
    experts.run(j, out_.data());
    AnswerArgs aa;
    aa.peers = win_.peers();
    aa.R = R, aa.me = g_.rank(), aa.epoch = r.epoch;
    aa.answer_off = answer_off(r.slot);
    aa.recv = recv;
    aa.count = recv_count_.data();
    aa.row_base = row_base_.data();
    aa.out = out_.data();
    aa.L = L;
    aa.blocks_done = done_.data() + 1;
    const unsigned ablocks = unsigned(std::clamp<int64_t>(recv_cap, 1, 4 * sm_count()));
    if (L.elt == 2) answer_kernel<bf16><<<ablocks, 256, 0, s>>>(aa);
    else answer_kernel<float><<<ablocks, 256, 0, s>>>(aa);
    EPMOE_CUDA_LAUNCHED();
  }

  // 7. Wait for every answer of the round, combine its tokens into y. (The plain combine waits in
  // its own prologue: one launch less. A rank without tokens still waits: the flags also say that
  // every peer has read its records of this slot, which the dispatch of epoch + 2 relies on.)
  void finish(const MoeTokens& in, const Round& r, const DispatchRecordLayout& L, float* y, cudaStream_t s) {
    const int R = rk_.R, K = in.K;
    const int64_t n = r.t1 - r.t0;
    const bool plain = n > 0 && !fast_ && fault_ == Fault::None;
    if (!plain) ipc_wait(win_, R, kCombine, r.epoch, 0, nullptr, 0, s);
    if (n == 0) return;
    HomeArrays& a = home_[r.slot];
    const unsigned char* answers = win_.mine() + answer_off(r.slot);
    const float* w = in.weights + r.t0 * K;
    float* yo = y + r.t0 * in.H;
    FaultCombine f = fc_;
    f.phys = in.physical + r.t0 * K;
    if (fast_) {
      a.pos.reserve(size_t(n * R));
      partial_positions_kernel<<<grid_for(n * R), 256, 0, s>>>(a.rec_pos.data(), n, R, a.pos.data());
      EPMOE_CUDA_LAUNCHED();
      combine_partials(reinterpret_cast<const float*>(answers), a.pos.data(), n, R, in.H,
                       fault_ != Fault::None ? &f : nullptr, yo, s);
    } else if (fault_ != Fault::None) {
      if (L.elt == 2)
        combine_slots_faulty(reinterpret_cast<const bf16*>(answers), nullptr, w, n, in.H, K, f, yo, s);
      else
        combine_slots_faulty(reinterpret_cast<const float*>(answers), nullptr, w, n, in.H, K, f, yo, s);
    } else {
      const FlagWait fw = ipc_flag_wait(win_, R, kCombine, r.epoch);
      if (L.elt == 2) combine_slots(reinterpret_cast<const bf16*>(answers), nullptr, w, n, in.H, K, 1.0f, yo, s, &fw);
      else combine_slots(reinterpret_cast<const float*>(answers), nullptr, w, n, in.H, K, 1.0f, yo, s, &fw);
    }
  }

  Group& g_;
  IpcWindow win_;
  IpcMode mode_;
  OwnerTable rk_;
  Fault fault_;
  bool fast_;
  int64_t bound_;      // promised most tokens per rank per call (0: unknown)
  int64_t round_cap_;  // lowlatency: tokens per round; fused: tokens per chunk
  int64_t cap_ = 0;    // tokens per rank the window holds per slot
  size_t layout_rec_ = 0, layout_ans_ = 0;
  FaultCombine fc_;
  HomeArrays home_[2];
  DeviceArray<int32_t> replicas_, recv_count_, row_base_;
  DeviceArray<unsigned> done_;
  DeviceArray<unsigned char> out_;
  cudaStream_t comm_ = nullptr;
  cudaEvent_t ev_in_ = nullptr, ev_out_ = nullptr;
};

}  // namespace

}  // namespace epmoe::cuda

namespace epmoe {

std::unique_ptr<A2ABackend> make_ipc_backend(const std::string& name, Group& g, int32_t* fault_word, const Placement& p,
                                             const BackendOptions& o) {
  if (name == "onesided") return std::make_unique<cuda::IpcBackend>(g, fault_word, p, o, cuda::IpcMode::OneSided);
  if (name == "lowlatency") return std::make_unique<cuda::IpcBackend>(g, fault_word, p, o, cuda::IpcMode::LowLatency);
  if (name == "fused") return std::make_unique<cuda::IpcBackend>(g, fault_word, p, o, cuda::IpcMode::Fused);
  throw Error("make_ipc_backend: '" + name + "' does not write into peers' memory");
}

}  // namespace epmoe
