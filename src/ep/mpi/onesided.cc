// onesided: MPI-3 RMA, the shape of MoRI and NVSHMEM-style dispatch. Each rank exposes
//   - a counter: senders reserve record slots in it with MPI_Fetch_and_op (atomic add),
//   - a request window: senders MPI_Put their records at the reserved offset,
//   - an answer window: serving ranks MPI_Put each answer straight to its final place at home
//     (row t*K + k for the deterministic combine, row t*R + d for the fast one).
// Records land in a racy order; each carries its source, token and slots, and the experts are
// batch-invariant, so the result does not depend on the order. An Ibarrier with the group's
// timeout precedes every fence, so a dead peer aborts the group instead of hanging it.
#include <mpi.h>

#include <algorithm>
#include <cstring>

#include "ep/mpi/backends_impl.h"
#include "util/error.h"

namespace epmoe {

namespace {

struct Window {
  MPI_Win win = MPI_WIN_NULL;
  void* base = nullptr;
  size_t bytes = 0;
  void allocate(size_t n, int disp_unit) {
    free();
    bytes = std::max<size_t>(n, 8);
    MPI_Win_allocate(MPI_Aint(bytes), disp_unit, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
  }
  void free() {
    if (win != MPI_WIN_NULL) MPI_Win_free(&win);
    win = MPI_WIN_NULL;
  }
};

class OneSidedBackend : public A2ABackend {
 public:
  OneSidedBackend(MpiGroup& c, const Placement& p, const BackendOptions& o) : comm_(c), p_(p), opt_(o) {}
  ~OneSidedBackend() override {
    counter_.free();
    requests_.free();
    answers_.free();
  }
  Device device() const override { return Device::Cpu; }
  std::string name() const override { return "onesided"; }

  void run(const MoeTokens& in, ExpertRunner& experts, float* y) override {
    const int R = comm_.size(), me = comm_.rank();
    const DispatchRecordLayout L = host_record_layout(in);
    const int64_t Tmax = comm_.allreduce_max(in.T);
    ensure_windows(L, R, Tmax);
    DispatchPlan plan = DispatchPlan::dedup(in, p_, 0, in.T);

    // 1. Reserve record slots at every destination (atomic fetch-and-add on its counter).
    *static_cast<int64_t*>(counter_.base) = 0;
    fence(counter_, "onesided reserve");
    std::vector<int64_t> base(size_t(R), 0);
    for (int d = 0; d < R; d++) {
      int64_t n = int64_t(plan.to[size_t(d)].size());
      if (n) MPI_Fetch_and_op(&n, &base[size_t(d)], MPI_INT64_T, d, 0, MPI_SUM, counter_.win);
    }
    fence(counter_, "onesided reserve");

    // 2. Put the records at the reserved offsets.
    std::vector<std::vector<char>> packed(static_cast<size_t>(R));
    fence(requests_, "onesided dispatch");
    for (int d = 0; d < R; d++) {
      const auto& recs = plan.to[size_t(d)];
      if (recs.empty()) continue;
      packed[size_t(d)].resize(recs.size() * L.bytes());
      pack_records(in, p_, recs, d, me, L, opt_.fault, packed[size_t(d)].data());
      if (d != me) comm_.add_bytes_sent(packed[size_t(d)].size());
      MPI_Put(packed[size_t(d)].data(), int(packed[size_t(d)].size()), MPI_BYTE, d,
              MPI_Aint(size_t(base[size_t(d)]) * L.bytes()), int(packed[size_t(d)].size()), MPI_BYTE,
              requests_.win);
    }
    fence(requests_, "onesided dispatch");
    const int64_t received = *static_cast<int64_t*>(counter_.base);
    EPMOE_ASSERT(received <= capacity_records_, "onesided: more records than the window holds");

    // 3. Serve, and put every answer at its final place at home.
    const char* recs = static_cast<const char*>(requests_.base);
    std::vector<float> answers(count_answers(recs, size_t(received), L, opt_.combine) * size_t(L.H));
    serve_records(recs, size_t(received), L, experts, opt_.combine, answers.data());
    fence(answers_, "onesided combine");
    const float* a = answers.data();
    for (int64_t i = 0; i < received; i++) {
      RecordView r = record_at(recs, size_t(i), L);
      auto put_row = [&](size_t row) {
        if (r.src() != me) comm_.add_bytes_sent(L.answer_bytes());
        MPI_Put(a, L.H, MPI_FLOAT, r.src(), MPI_Aint(row * size_t(L.H)), L.H, MPI_FLOAT, answers_.win);
        a += L.H;
      };
      switch (opt_.combine) {
        case CombineMode::Deterministic:
          for (int k = 0; k < L.K; k++)
            if (r.physical(k) >= 0) put_row(size_t(r.token()) * size_t(L.K) + size_t(k));
          break;
        case CombineMode::Fast: put_row(size_t(r.token()) * size_t(R) + size_t(me)); break;
      }
    }
    fence(answers_, "onesided combine");

    // 4. Combine at home.
    float* home = static_cast<float*>(answers_.base);
    switch (opt_.combine) {
      case CombineMode::Deterministic: finish_slots(in, p_, opt_.fault, me, 0, in.T, home, y); break;
      case CombineMode::Fast: {
        // Partials of rank d sit at rows t*R + d; add them in rank order, as combine_answers does.
        std::fill(y, y + in.T * L.H, 0.0f);
        for (int d = 0; d < R; d++)
          for (const Record& rec : plan.to[size_t(d)])
            add_partial(in, opt_.fault, me, d, rec.token, 0, in.T,
                        home + (size_t(rec.token) * size_t(R) + size_t(d)) * size_t(L.H), y);
        finish_partials(in, p_, opt_.fault, 0, in.T, y);
        break;
      }
    }
  }

 private:
  void fence(Window& w, const char* what) {
    comm_.barrier();  // with timeout: a dead peer aborts here rather than in the fence
    int rc = MPI_Win_fence(0, w.win);
    if (rc != MPI_SUCCESS) comm_.abort_group(std::string(what) + ": MPI_Win_fence failed", 1);
  }

  // Window sizes depend on (H, K, R) and the largest T of any rank; every rank computes the same
  // sizes from the all-reduced T, so the collective (re)allocation happens on all ranks at once.
  void ensure_windows(const DispatchRecordLayout& L, int R, int64_t Tmax) {
    if (counter_.win == MPI_WIN_NULL) counter_.allocate(sizeof(int64_t), 1);
    if (L.H == H_ && L.K == K_ && Tmax <= capacity_tokens_) return;
    H_ = L.H;
    K_ = L.K;
    capacity_tokens_ = 64;
    while (capacity_tokens_ < Tmax) capacity_tokens_ *= 2;
    capacity_records_ = capacity_tokens_ * R;  // dedup: at most one record per (token, destination)
    requests_.allocate(size_t(capacity_records_) * L.bytes(), 1);
    answers_.allocate(size_t(capacity_tokens_) * size_t(std::max(L.K, R)) * L.answer_bytes(), sizeof(float));
  }

  MpiGroup& comm_;
  const Placement& p_;
  BackendOptions opt_;
  Window counter_, requests_, answers_;
  int H_ = -1, K_ = -1;
  int64_t capacity_tokens_ = 0, capacity_records_ = 0;
};

}  // namespace

std::unique_ptr<A2ABackend> make_mpi_onesided_backend(MpiGroup& c, const Placement& p, const BackendOptions& o) {
  return std::make_unique<OneSidedBackend>(c, p, o);
}

}  // namespace epmoe
