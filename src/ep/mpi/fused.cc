// fused: tokens in chunks, pipelined with non-blocking all-to-alls so that the dispatch of chunk
// c+1 and the answers of chunk c-1 are in flight while the experts of chunk c run (the shape of
// ascend_fuseep's fused dispatch-GEMM-combine). The number of chunks is agreed by all ranks.
#include <algorithm>

#include "ep/mpi/backends_impl.h"

namespace epmoe {

namespace {

struct Chunk {
  int64_t t0 = 0, t1 = 0;
  DispatchPlan plan;
  std::vector<int64_t> recv_n;
  std::vector<char> send, recv;
  std::unique_ptr<PendingOp> dispatch;
  Answers answers;
  std::vector<size_t> back_b;
  std::vector<float> back;
  std::unique_ptr<PendingOp> combine;
};

class FusedBackend : public A2ABackend {
 public:
  FusedBackend(MpiGroup& c, const Placement& p, const BackendOptions& o) : comm_(c), p_(p), opt_(o) {}
  Device device() const override { return Device::Cpu; }
  std::string name() const override { return "fused"; }

  void run(const MoeTokens& in, ExpertRunner& experts, float* y) override {
    const int64_t C = opt_.chunk_tokens;
    const int64_t n = comm_.allreduce_max((in.T + C - 1) / C);
    // Chunk state (and its buffers) persists across layers: grow-only, like the other backends.
    if (chunks_.size() < size_t(n)) chunks_.resize(size_t(n));
    auto& chunks = chunks_;
    for (int64_t c = 0; c < n; c++) {
      chunks[size_t(c)].t0 = std::min(in.T, c * C);
      chunks[size_t(c)].t1 = std::min(in.T, (c + 1) * C);
    }
    if (n > 0) post_dispatch(in, chunks[0]);
    for (int64_t c = 0; c < n; c++) {
      if (c + 1 < n) post_dispatch(in, chunks[size_t(c) + 1]);
      serve_and_post_answers(in, experts, chunks[size_t(c)]);
      if (c > 0) finish(in, chunks[size_t(c) - 1], y);
    }
    if (n > 0) finish(in, chunks[size_t(n) - 1], y);
  }

 private:
  void post_dispatch(const MoeTokens& in, Chunk& ch) {
    const int R = comm_.size();
    const DispatchRecordLayout L = host_record_layout(in);
    ch.plan = DispatchPlan::dedup(in, p_, ch.t0, ch.t1);
    std::vector<int64_t> send_n(static_cast<size_t>(R));
    ch.recv_n.assign(size_t(R), 0);
    for (int d = 0; d < R; d++) send_n[size_t(d)] = int64_t(ch.plan.to[size_t(d)].size());
    comm_.all_to_all(send_n.data(), sizeof(int64_t), ch.recv_n.data());  // small, blocking
    std::vector<size_t> send_b(static_cast<size_t>(R)), recv_b(static_cast<size_t>(R));
    for (int d = 0; d < R; d++) {
      send_b[size_t(d)] = size_t(send_n[size_t(d)]) * L.bytes();
      recv_b[size_t(d)] = size_t(ch.recv_n[size_t(d)]) * L.bytes();
    }
    ch.send.resize(total_bytes(send_b));
    ch.recv.resize(total_bytes(recv_b));
    size_t off = 0;
    for (int d = 0; d < R; d++) {
      pack_records(in, p_, ch.plan.to[size_t(d)], d, comm_.rank(), L, opt_.fault, ch.send.data() + off);
      off += send_b[size_t(d)];
    }
    ch.dispatch = comm_.all_to_all_v_async(ch.send.data(), send_b, ch.recv.data(), recv_b);
  }

  void serve_and_post_answers(const MoeTokens& in, ExpertRunner& experts, Chunk& ch) {
    const int R = comm_.size();
    const DispatchRecordLayout L = host_record_layout(in);
    comm_.wait(*ch.dispatch, "fused dispatch");
    serve_by_source(ch.recv.data(), ch.recv_n, L, experts, opt_.combine, ch.answers);
    ch.back_b.resize(static_cast<size_t>(R));
    for (int d = 0; d < R; d++) ch.back_b[size_t(d)] = ch.plan.answers_from(d, in, p_, opt_.combine) * L.answer_bytes();
    ch.back.resize(total_bytes(ch.back_b) / sizeof(float));
    ch.combine = comm_.all_to_all_v_async(ch.answers.rows.data(), ch.answers.bytes_to, ch.back.data(), ch.back_b);
  }

  void finish(const MoeTokens& in, Chunk& ch, float* y) {
    comm_.wait(*ch.combine, "fused combine");
    combine_answers(in, p_, ch.plan, split_by_rank(ch.back.data(), ch.back_b), opt_.combine, opt_.fault, comm_.rank(),
                    ch.t0, ch.t1, y);
  }

  MpiGroup& comm_;
  const Placement& p_;
  BackendOptions opt_;
  std::vector<Chunk> chunks_;
};

}  // namespace

std::unique_ptr<A2ABackend> make_mpi_fused_backend(MpiGroup& c, const Placement& p, const BackendOptions& o) {
  return std::make_unique<FusedBackend>(c, p, o);
}

}  // namespace epmoe
