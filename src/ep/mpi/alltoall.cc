// alltoall: exchange of record counts, then MPI_Alltoallv of the records (a token once per
// destination rank), the experts, and the answers back the same way (DeepEP normal mode).
#include "ep/mpi/backends_impl.h"

namespace epmoe {

void exchange_dedup_blocking(MpiGroup& comm, const Placement& p, const MoeTokens& in, ExpertRunner& experts,
                             const BackendOptions& opt, int64_t t0, int64_t t1, ExchangeBuffers& buf, float* y) {
  const CombineMode mode = opt.combine;
  const int R = comm.size(), me = comm.rank();
  const DispatchRecordLayout L = host_record_layout(in);
  DispatchPlan plan = DispatchPlan::dedup(in, p, t0, t1);

  std::vector<int64_t> send_n(static_cast<size_t>(R)), recv_n(static_cast<size_t>(R));
  for (int d = 0; d < R; d++) send_n[size_t(d)] = int64_t(plan.to[size_t(d)].size());
  comm.all_to_all(send_n.data(), sizeof(int64_t), recv_n.data());

  std::vector<size_t> send_b(static_cast<size_t>(R)), recv_b(static_cast<size_t>(R));
  size_t send_total = 0, recv_total = 0;
  for (int d = 0; d < R; d++) {
    send_total += send_b[size_t(d)] = size_t(send_n[size_t(d)]) * L.bytes();
    recv_total += recv_b[size_t(d)] = size_t(recv_n[size_t(d)]) * L.bytes();
  }
  buf.send.resize(send_total);
  buf.recv.resize(recv_total);
  for (int d = 0, off = 0; d < R; off += int(send_b[size_t(d)]), d++)
    pack_records(in, p, plan.to[size_t(d)], d, me, L, opt.fault, buf.send.data() + off);
  comm.all_to_all_v(buf.send.data(), send_b, buf.recv.data(), recv_b);

  thread_local Answers a;
  serve_by_source(buf.recv.data(), recv_n, L, experts, mode, a);
  std::vector<size_t> back_b(static_cast<size_t>(R));
  for (int d = 0; d < R; d++) back_b[size_t(d)] = plan.answers_from(d, in, p, mode) * L.answer_bytes();
  buf.back.resize(total_bytes(back_b) / sizeof(float));
  comm.all_to_all_v(a.rows.data(), a.bytes_to, buf.back.data(), back_b);
  combine_answers(in, p, plan, split_by_rank(buf.back.data(), back_b), mode, opt.fault, me, t0, t1, y);
}

namespace {

class AllToAllBackend : public A2ABackend {
 public:
  AllToAllBackend(MpiGroup& c, const Placement& p, const BackendOptions& o) : comm_(c), p_(p), opt_(o) {}
  Device device() const override { return Device::Cpu; }
  std::string name() const override { return "alltoall"; }
  void run(const MoeTokens& in, ExpertRunner& experts, float* y) override {
    exchange_dedup_blocking(comm_, p_, in, experts, opt_, 0, in.T, buf_, y);
  }

 private:
  MpiGroup& comm_;
  const Placement& p_;
  BackendOptions opt_;
  ExchangeBuffers buf_;
};

}  // namespace

std::unique_ptr<A2ABackend> make_mpi_alltoall_backend(MpiGroup& c, const Placement& p, const BackendOptions& o) {
  return std::make_unique<AllToAllBackend>(c, p, o);
}

}  // namespace epmoe
