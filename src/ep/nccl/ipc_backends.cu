// onesided and lowlatency on GPUs: every rank's receive buffers mapped into every process (ep/cuda/ipc_window.cuh),
// and kernels that write straight into them over NVLink -- the shape of DeepEP's intranode mode and
// of MoRI, the GPU twin of src/ep/mpi/onesided.cc (MPI-3 RMA). No NCCL call on the hot path.
//
// One call (one epoch e):
//   1. home plan (dedup: a record per (token, destination rank), as alltoall)
//   2. reserve: one device atomic add per destination on its counter[e & 1] -> where this rank's
//      records start in the destination's receive region
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

#include "comm/nccl_group.h"
#include "ep/cuda/ipc_window.cuh"
#include "ep/cuda/plan_combine.cuh"
#include "ep/fault.h"
#include "ep/nccl/home_plan.cuh"
#include "ep/nccl/nccl_backends.h"

namespace epmoe::cuda {

namespace {

constexpr int kDispatch = 0, kCombine = 1;  // IpcSignals::flag stages

// A record: [row][K int32 physical ids, -1 where not served][token][source][K fp32 weights: fast
// combine only], 16-byte aligned.
struct RecordLayout {
  int H = 0, K = 0;
  size_t elt = 2;
  bool fast = false;
  __host__ __device__ size_t row() const { return size_t(H) * elt; }
  __host__ __device__ size_t phys_off() const { return row(); }
  __host__ __device__ size_t token_off() const { return row() + 4 * size_t(K); }
  __host__ __device__ size_t weight_off() const { return token_off() + 8; }
  __host__ __device__ size_t bytes() const { return (weight_off() + (fast ? 4 * size_t(K) : 0) + 15) / 16 * 16; }
  // Home side: bytes of one answer row.
  __host__ __device__ size_t answer_bytes() const { return fast ? size_t(H) * 4 : row(); }
};

struct PutArgs {
  IpcPeers peers;
  OwnerTable rk;
  int me = 0;
  uint64_t epoch = 0;
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
  RecordLayout L;
  unsigned* blocks_done = nullptr;
};

__global__ void reserve_kernel(IpcPeers peers, int R, uint64_t epoch, const int32_t* counts, int32_t* base) {
  const int d = threadIdx.x;
  if (d < R) {
    const int n = counts[d];
    auto* sig = reinterpret_cast<IpcSignals*>(peers.base[d]);
    base[d] = n > 0 ? atomicAdd_system(&sig->counter[epoch & 1], n) : 0;
  }
}

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
    int32_t* ids = reinterpret_cast<int32_t*>(rec + a.L.phys_off());
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
      const int p = a.phys[int64_t(t) * K + k];
      const bool served = slot >= 0 ? k == slot : owner_of(a.rk, p) == d;
      ids[k] = served ? p : -1;
      if (a.L.fast) {
        const float w = a.weights[int64_t(t) * K + k];
        reinterpret_cast<float*>(rec + a.L.weight_off())[k] = served ? (a.replicas ? w * float(a.replicas[p]) : w) : 0.f;
      }
    }
    if (threadIdx.x == 0) {
      reinterpret_cast<int32_t*>(rec + a.L.token_off())[0] = int32_t(t - a.t0);
      reinterpret_cast<int32_t*>(rec + a.L.token_off())[1] = a.me;
    }
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(a.x) + size_t(t) * a.L.row());
    uint4* dst = reinterpret_cast<uint4*>(rec);
    const int n16 = int(a.L.row() / 16);
    for (int q = threadIdx.x; q < n16; q += blockDim.x) dst[q] = src[q];
  }
  ipc_grid_done_signal(a.peers, R, a.me, kDispatch, a.epoch, a.blocks_done);
}

struct AnswerArgs {
  IpcPeers peers;
  int R = 0, me = 0;
  uint64_t epoch = 0;
  size_t answer_off = 0;  // region of answers in every window
  const unsigned char* recv = nullptr;
  const int32_t* count = nullptr;  // received records (device)
  const int32_t* row_base = nullptr;
  const unsigned char* out = nullptr;  // compact expert outputs (activation type)
  RecordLayout L;
  unsigned* blocks_done = nullptr;
};

// One block per received record: its answers go home, straight to their final rows.
template <class TA>
__global__ void __launch_bounds__(256) answer_kernel(const AnswerArgs a) {
  const int n = *a.count, K = a.L.K, H = a.L.H;
  const size_t rb = a.L.bytes();
  for (int i = blockIdx.x; i < n; i += gridDim.x) {
    const unsigned char* rec = a.recv + size_t(i) * rb;
    const int32_t* ids = reinterpret_cast<const int32_t*>(rec + a.L.phys_off());
    const int t = reinterpret_cast<const int32_t*>(rec + a.L.token_off())[0];
    const int src = reinterpret_cast<const int32_t*>(rec + a.L.token_off())[1];
    unsigned char* home = a.peers.base[src] + a.answer_off;
    const TA* out = reinterpret_cast<const TA*>(a.out);
    int64_t j = a.row_base[i];
    if (!a.L.fast) {
      const int n16 = int(a.L.row() / 16);
      for (int k = 0; k < K; k++) {
        if (ids[k] < 0) continue;
        const uint4* s = reinterpret_cast<const uint4*>(out + j * H);
        uint4* d = reinterpret_cast<uint4*>(home + (size_t(t) * K + k) * a.L.row());
        for (int q = threadIdx.x; q < n16; q += blockDim.x) d[q] = s[q];
        j++;
      }
    } else {
      const float* w = reinterpret_cast<const float*>(rec + a.L.weight_off());
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
  ipc_grid_done_signal(a.peers, a.R, a.me, kCombine, a.epoch, a.blocks_done);
}

// Fast combine at home: where the partial of (t, d) is (t * R + d), or -1 when d serves none of
// t's slots -- from the home plan's record map.
__global__ void partial_positions_kernel(const int32_t* rec_pos, int64_t T, int R, int32_t* pos) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < T * R; i += int64_t(gridDim.x) * blockDim.x)
    pos[i] = rec_pos[i] >= 0 ? int32_t(i) : -1;
}

// onesided, and lowlatency over the same machinery: a record per (token, slot), a fixed capacity of
// C tokens per rank per round (BackendOptions::max_dispatch_tokens_per_rank), more tokens in further
// rounds (never dropped), each round one epoch of the exchange above.
class IpcBackend final : public A2ABackend {
 public:
  IpcBackend(NcclGroup& g, const Placement& p, const BackendOptions& o, bool bounded)
      : g_(g),
        win_(g),
        fault_(o.fault),
        fast_(o.combine == CombineMode::Fast),
        bounded_(bounded),
        bound_(o.max_tokens_per_rank),
        round_cap_(o.max_dispatch_tokens_per_rank) {
    EPMOE_ASSERT(p.ranks <= kMaxOwnerRanks, "onesided on gpus: at most 16 ranks");
    EPMOE_ASSERT(!bounded_ || !fast_, "lowlatency on gpus combines deterministically");
    EPMOE_ASSERT(!bounded_ || round_cap_ > 0, "lowlatency: a capacity of at least one token per round");
    rk_.R = p.ranks;
    for (int i = 0; i <= p.ranks; i++) rk_.begin[i] = p.rank_begin[size_t(i)];
    if (fault_ != Fault::None) {
      std::vector<int32_t> rep(size_t(p.num_physical()));
      for (int q = 0; q < p.num_physical(); q++)
        rep[size_t(q)] = int32_t(p.replicas[size_t(p.logical_of[size_t(q)])].size());
      replicas_.upload(rep);
      fc_.kind = int(fault_);
      fc_.me = g.rank();
      fc_.owner = rk_;
      fc_.replicas = replicas_.data();
      fc_.scale = fault_output_scale(fault_, p);
    }
    done_.reserve(2);
    EPMOE_CUDA_CHECK(cudaMemset(done_.data(), 0, 2 * sizeof(unsigned)));
  }
  std::string name() const override { return bounded_ ? "lowlatency" : "onesided"; }
  Device device() const override { return Device::Cuda; }

  void run(const MoeTokens& in, ExpertRunner& experts, float* y) override {
    RecordLayout L;
    L.H = in.H, L.K = in.K, L.elt = in.act == DType::BF16 ? 2 : 4, L.fast = fast_;
    EPMOE_ASSERT(L.row() % 16 == 0, "onesided on gpus: rows of a multiple of 16 bytes");
    if (!bounded_) {
      ensure_window(L, agreed_tokens(in));
      round(in, experts, y, 0, in.T, L);
      return;
    }
    // lowlatency: rounds of C tokens; the ranks agree on their number unless the promised bound
    // fits in one.
    const int64_t C = round_cap_;
    ensure_window(L, C);
    int64_t rounds;
    if (bound_ > 0 && bound_ <= C) {
      check_bound(in);
      rounds = 1;
    } else {
      rounds = g_.allreduce_max((in.T + C - 1) / C);
    }
    if (fault_drops_overflow(fault_) && rounds > 1) {
      // The injected bug class (ep/fault.h): one round only; tokens beyond the capacity silently
      // get no expert output.
      rounds = 1;
      if (in.T > C)
        EPMOE_CUDA_CHECK(cudaMemsetAsync(y + C * in.H, 0, size_t(in.T - C) * size_t(in.H) * 4, stream()));
    }
    for (int64_t r = 0; r < rounds; r++) {
      const int64_t t0 = std::min(in.T, r * C), t1 = std::min(in.T, t0 + C);
      round(in, experts, y, t0, t1, L);
    }
  }

 private:
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

  // The window holds, per round, C tokens of every rank: R * C records (R * C * K with a record per
  // slot) and C tokens' answers. It only grows, and every rank grows it together (same C).
  void ensure_window(const RecordLayout& L, int64_t C) {
    if (win_.allocated() && C <= cap_ && L.bytes() == layout_rec_ && L.answer_bytes() == layout_ans_) return;
    cap_ = bounded_ || bound_ > 0 ? std::max<int64_t>(C, 1) : std::max<int64_t>({C, 2 * cap_, 64});
    layout_rec_ = L.bytes();
    layout_ans_ = L.answer_bytes();
    const size_t ans_rows = L.fast ? size_t(rk_.R) : size_t(L.K);
    win_.allocate(IpcLayout({recv_capacity(L) * L.bytes(), size_t(cap_) * ans_rows * L.answer_bytes()}));
  }
  size_t recv_capacity(const RecordLayout& L) const {
    return size_t(rk_.R) * size_t(cap_) * (bounded_ ? size_t(L.K) : 1);
  }

  // One epoch: tokens [t0, t1) of this rank out and home again, combined into y.
  void round(const MoeTokens& in, ExpertRunner& experts, float* y, int64_t t0, int64_t t1, const RecordLayout& L) {
    const int R = rk_.R, me = g_.rank(), K = in.K;
    const uint64_t e = win_.next_epoch();
    cudaStream_t s = stream();
    const int64_t n = t1 - t0;

    // 1-3. Plan, reserve, put.
    const int64_t rec_bound = std::max<int64_t>(n, 1) * (bounded_ ? K : std::min(R, K));
    counts_.reserve(2 * size_t(R));
    base_.reserve(size_t(R));
    slot_pos_.reserve(size_t(std::max<int64_t>(n, 1) * K));
    rec_token_.reserve(size_t(rec_bound));
    rec_slot_.reserve(size_t(rec_bound));
    rec_dest_.reserve(size_t(rec_bound));
    if (fast_) rec_pos_.reserve(size_t(std::max<int64_t>(n, 1) * R));
    HomePlanArgs hp;
    hp.rk = rk_;
    hp.phys = in.physical;
    hp.t0 = t0, hp.t1 = t1, hp.K = K;
    hp.per_slot = bounded_;
    hp.counts = counts_.data();
    hp.rec_token = rec_token_.data(), hp.rec_slot = rec_slot_.data(), hp.rec_dest = rec_dest_.data();
    hp.rec_bound = rec_bound;
    hp.slot_pos = slot_pos_.data();
    hp.rec_pos = fast_ ? rec_pos_.data() : nullptr;
    home_plan(hp, s);
    reserve_kernel<<<1, 32, 0, s>>>(win_.peers(), R, e, counts_.data(), base_.data());
    EPMOE_CUDA_LAUNCHED();
    PutArgs pa;
    pa.peers = win_.peers();
    pa.rk = rk_;
    pa.me = me;
    pa.epoch = e;
    pa.recv_off = win_.layout().offsets[0];
    pa.counts = counts_.data();
    pa.base = base_.data();
    pa.rec_token = rec_token_.data();
    pa.rec_slot = rec_slot_.data();
    pa.rec_dest = rec_dest_.data();
    pa.t0 = t0;
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

    // 4-5. Wait for every source, serve what arrived.
    const int64_t recv_cap = int64_t(recv_capacity(L));
    recv_count_.reserve(1);
    ipc_wait(win_, R, kDispatch, e, recv_count_.data(), int32_t(recv_cap), s);
    row_base_.reserve(size_t(recv_cap) + 1);
    out_.reserve(size_t(recv_cap) * size_t(bounded_ ? 1 : K) * L.row());
    ExpertJobs j;
    unsigned char* recv = win_.mine() + win_.layout().offsets[0];
    j.x = recv;
    j.x_stride = int64_t(L.bytes() / L.elt);
    j.phys = reinterpret_cast<const int32_t*>(recv + L.phys_off());
    j.phys_stride = int64_t(L.bytes() / 4);
    j.rows = recv_cap;
    j.rows_dev = recv_count_.data();
    j.K = K;
    j.compact = true;
    j.row_base = row_base_.data();
    experts.run(j, out_.data());

    // 6. Answers home.
    AnswerArgs aa;
    aa.peers = win_.peers();
    aa.R = R, aa.me = me, aa.epoch = e;
    aa.answer_off = win_.layout().offsets[1];
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

    // 7. Wait for every answer, combine.
    ipc_wait(win_, R, kCombine, e, nullptr, 0, s);
    if (n == 0) return;
    const unsigned char* answers = win_.mine() + win_.layout().offsets[1];
    const float* w = in.weights + t0 * K;
    float* yo = y + t0 * in.H;
    FaultCombine f = fc_;
    f.phys = in.physical + t0 * K;
    if (fast_) {
      pos_.reserve(size_t(n * R));
      partial_positions_kernel<<<grid_for(n * R), 256, 0, s>>>(rec_pos_.data(), n, R, pos_.data());
      EPMOE_CUDA_LAUNCHED();
      combine_partials(reinterpret_cast<const float*>(answers), pos_.data(), n, R, in.H,
                       fault_ != Fault::None ? &f : nullptr, yo, s);
    } else if (fault_ != Fault::None) {
      if (L.elt == 2)
        combine_slots_faulty(reinterpret_cast<const bf16*>(answers), nullptr, w, n, in.H, K, f, yo, s);
      else
        combine_slots_faulty(reinterpret_cast<const float*>(answers), nullptr, w, n, in.H, K, f, yo, s);
    } else if (L.elt == 2) {
      combine_slots(reinterpret_cast<const bf16*>(answers), nullptr, w, n, in.H, K, 1.0f, yo, s);
    } else {
      combine_slots(reinterpret_cast<const float*>(answers), nullptr, w, n, in.H, K, 1.0f, yo, s);
    }
  }

  NcclGroup& g_;
  IpcWindow win_;
  OwnerTable rk_;
  Fault fault_;
  bool fast_;
  bool bounded_;       // lowlatency: a record per slot, rounds of round_cap_ tokens
  int64_t bound_;      // promised most tokens per rank per call (0: unknown)
  int64_t round_cap_;
  int64_t cap_ = 0;    // tokens per rank the window holds per round
  size_t layout_rec_ = 0, layout_ans_ = 0;
  FaultCombine fc_;
  DeviceArray<int32_t> replicas_, counts_, base_, slot_pos_, rec_token_, rec_slot_, rec_dest_, rec_pos_, pos_;
  DeviceArray<int32_t> recv_count_, row_base_;
  DeviceArray<unsigned> done_;
  DeviceArray<unsigned char> out_;
};

}  // namespace

}  // namespace epmoe::cuda

namespace epmoe {

std::unique_ptr<A2ABackend> make_ipc_onesided_backend(NcclGroup& g, const Placement& p, const BackendOptions& o) {
  return std::make_unique<cuda::IpcBackend>(g, p, o, /*bounded=*/false);
}

std::unique_ptr<A2ABackend> make_ipc_lowlatency_backend(NcclGroup& g, const Placement& p, const BackendOptions& o) {
  return std::make_unique<cuda::IpcBackend>(g, p, o, /*bounded=*/true);
}

}  // namespace epmoe
