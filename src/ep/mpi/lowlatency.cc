// lowlatency: buffers of fixed capacity allocated once (--max-dispatch-tokens-per-rank tokens
// per rank per round), one message per (token, expert) as DeepEP low-latency and pplx-kernels.
// Each peer has a fixed region of the buffers. When a rank holds more tokens than the capacity,
// every rank runs further rounds (their number agreed by an all-reduce): nothing is dropped.
#include <algorithm>

#include "ep/mpi/backends_impl.h"
#include "util/error.h"

namespace epmoe {

namespace {

class LowLatencyBackend : public A2ABackend {
 public:
  LowLatencyBackend(MpiGroup& c, const Placement& p, const BackendOptions& o) : comm_(c), p_(p), opt_(o) {}
  Device device() const override { return Device::Cpu; }
  std::string name() const override { return "lowlatency"; }

  void run(const MoeTokens& in, ExpertRunner& experts, float* y) override {
    const int R = comm_.size(), me = comm_.rank();
    const int64_t C = opt_.max_dispatch_tokens_per_rank;
    const DispatchRecordLayout L = host_record_layout(in);
    allocate_once(L, R, C);
    int64_t rounds = comm_.allreduce_max((in.T + C - 1) / C);
    if (fault_drops_overflow(opt_.fault) && rounds > 1) {
      // The bug class: one round only; tokens beyond the capacity silently get no expert output.
      rounds = 1;
      if (in.T > C) std::fill(y + C * in.H, y + in.T * in.H, 0.0f);
    }
    const size_t region_rec = size_t(C) * size_t(in.K) * L.bytes();
    const size_t region_ans = size_t(C) * size_t(in.K) * L.answer_bytes();
    std::vector<size_t> rec_displ(static_cast<size_t>(R)), ans_displ(static_cast<size_t>(R));
    for (int d = 0; d < R; d++) {
      rec_displ[size_t(d)] = size_t(d) * region_rec;
      ans_displ[size_t(d)] = size_t(d) * region_ans;
    }
    for (int64_t round = 0; round < rounds; round++) {
      const int64_t t0 = std::min(in.T, round * C), t1 = std::min(in.T, t0 + C);
      DispatchPlan plan = DispatchPlan::per_slot(in, p_, t0, t1);
      std::vector<int64_t> send_n(static_cast<size_t>(R)), recv_n(static_cast<size_t>(R));
      std::vector<size_t> send_b(static_cast<size_t>(R)), recv_b(static_cast<size_t>(R));
      for (int d = 0; d < R; d++) {
        const auto& recs = plan.to[size_t(d)];
        EPMOE_ASSERT(recs.size() <= size_t(C * in.K), "lowlatency: records exceed the fixed capacity");
        send_n[size_t(d)] = int64_t(recs.size());
        send_b[size_t(d)] = recs.size() * L.bytes();
        pack_records(in, p_, recs, d, me, L, opt_.fault, send_.data() + rec_displ[size_t(d)]);
      }
      comm_.all_to_all(send_n.data(), sizeof(int64_t), recv_n.data());
      for (int d = 0; d < R; d++) recv_b[size_t(d)] = size_t(recv_n[size_t(d)]) * L.bytes();
      comm_.all_to_all_v(send_.data(), send_b, rec_displ, recv_.data(), recv_b, rec_displ);

      // Serve each source's region; answers go to the same fixed region index.
      std::vector<size_t> ans_send_b(static_cast<size_t>(R)), ans_recv_b(static_cast<size_t>(R));
      for (int s = 0; s < R; s++) {
        const char* recs = recv_.data() + rec_displ[size_t(s)];
        const size_t n = size_t(recv_n[size_t(s)]);
        ans_send_b[size_t(s)] = count_answers(recs, n, L, opt_.combine) * L.answer_bytes();
        serve_records(recs, n, L, experts, opt_.combine, answers_out_.data() + ans_displ[size_t(s)] / sizeof(float));
      }
      for (int d = 0; d < R; d++) ans_recv_b[size_t(d)] = plan.answers_from(d, in, p_, opt_.combine) * L.answer_bytes();
      comm_.all_to_all_v(answers_out_.data(), ans_send_b, ans_displ, answers_in_.data(), ans_recv_b, ans_displ);
      std::vector<const float*> from(static_cast<size_t>(R));
      for (int d = 0; d < R; d++) from[size_t(d)] = answers_in_.data() + ans_displ[size_t(d)] / sizeof(float);
      combine_answers(in, p_, plan, from, opt_.combine, opt_.fault, me, t0, t1, y);
    }
  }

 private:
  // The buffers depend only on (H, K, R, capacity), fixed for a model: allocated on the first
  // layer and reused by every later one.
  void allocate_once(const DispatchRecordLayout& L, int R, int64_t C) {
    if (L.H == H_ && L.K == K_) return;
    H_ = L.H;
    K_ = L.K;
    const size_t per_peer = size_t(C) * size_t(L.K);
    send_.assign(size_t(R) * per_peer * L.bytes(), 0);
    recv_.assign(size_t(R) * per_peer * L.bytes(), 0);
    answers_out_.assign(size_t(R) * per_peer * size_t(L.H), 0.f);
    answers_in_.assign(size_t(R) * per_peer * size_t(L.H), 0.f);
  }

  MpiGroup& comm_;
  const Placement& p_;
  BackendOptions opt_;
  int H_ = -1, K_ = -1;
  std::vector<char> send_, recv_;
  std::vector<float> answers_out_, answers_in_;
};

}  // namespace

std::unique_ptr<A2ABackend> make_mpi_lowlatency_backend(MpiGroup& c, const Placement& p, const BackendOptions& o) {
  return std::make_unique<LowLatencyBackend>(c, p, o);
}

}  // namespace epmoe
