// none: all-gather of tokens and routing; every rank serves its own experts for every token;
// per-slot answers return home through one all-to-all (sglang's `none` + standard dispatcher,
// Megatron's allgather dispatcher -- but the reduction happens once, at home, here).
#include "ep/mpi/backends_impl.h"

namespace epmoe {

namespace {

class NoneBackend : public A2ABackend {
 public:
  NoneBackend(MpiGroup& c, const Placement& p, const BackendOptions& o) : comm_(c), p_(p), opt_(o) {}
  Device device() const override { return Device::Cpu; }
  std::string name() const override { return "none"; }

  void run(const MoeTokens& in, ExpertRunner& experts, float* y) override {
    const int R = comm_.size(), me = comm_.rank();
    const DispatchRecordLayout L = host_record_layout(in);
    std::vector<int64_t> T(static_cast<size_t>(R));
    comm_.allgather(&in.T, sizeof(int64_t), T.data());
    int64_t total = 0;
    for (int64_t t : T) total += t;
    auto& x = x_;
    auto& w = w_;
    auto& phys = phys_;
    x.resize(size_t(total * in.H));
    w.resize(size_t(total * in.K));
    phys.resize(size_t(total * in.K));
    std::vector<size_t> xb(static_cast<size_t>(R)), kb(static_cast<size_t>(R));
    for (int r = 0; r < R; r++) {
      xb[size_t(r)] = size_t(T[size_t(r)]) * size_t(in.H) * sizeof(float);
      kb[size_t(r)] = size_t(T[size_t(r)]) * size_t(in.K) * sizeof(float);
    }
    comm_.allgatherv(host_rows(in), xb[size_t(me)], x.data(), xb);
    comm_.allgatherv(in.physical, kb[size_t(me)], phys.data(), kb);
    comm_.allgatherv(in.weights, kb[size_t(me)], w.data(), kb);

    // Every rank now sees every token; serve the slots this rank owns, source by source.
    std::vector<int64_t> records_from(static_cast<size_t>(R));
    auto& records = records_;
    records.clear();
    int64_t base = 0;
    for (int s = 0; s < R; s++) {
      MoeTokens view = in;
      view.T = T[size_t(s)];
      view.x = x.data() + base * in.H;
      view.physical = phys.data() + base * in.K;
      view.weights = w.data() + base * in.K;
      auto mine = DispatchPlan::dedup(view, p_, 0, view.T).to[size_t(me)];
      records_from[size_t(s)] = int64_t(mine.size());
      const size_t off = records.size();
      records.resize(off + mine.size() * L.bytes());
      pack_records(view, p_, mine, me, s, L, opt_.fault, records.data() + off);
      base += T[size_t(s)];
    }
    serve_by_source(records.data(), records_from, L, experts, opt_.combine, answers_);
    const Answers& a = answers_;

    DispatchPlan plan = DispatchPlan::dedup(in, p_, 0, in.T);
    std::vector<size_t> back_b(static_cast<size_t>(R));
    for (int d = 0; d < R; d++) back_b[size_t(d)] = plan.answers_from(d, in, p_, opt_.combine) * L.answer_bytes();
    auto& back = back_;
    back.resize(total_bytes(back_b) / sizeof(float));
    comm_.all_to_all_v(a.rows.data(), a.bytes_to, back.data(), back_b);
    combine_answers(in, p_, plan, split_by_rank(back.data(), back_b), opt_.combine, opt_.fault, me, 0, in.T, y);
  }

 private:
  MpiGroup& comm_;
  const Placement& p_;
  BackendOptions opt_;
  Answers answers_;
  // Grow-only buffers reused by every layer (fresh pages are costly to fault in).
  std::vector<float> x_, w_, back_;
  std::vector<int32_t> phys_;
  std::vector<char> records_;
};

}  // namespace

std::unique_ptr<A2ABackend> make_mpi_none_backend(MpiGroup& c, const Placement& p, const BackendOptions& o) {
  return std::make_unique<NoneBackend>(c, p, o);
}

}  // namespace epmoe
