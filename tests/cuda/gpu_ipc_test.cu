// The GPU backends that write into peers' memory (onesided, lowlatency, fused:
// src/ep/nccl/ipc_backends.cu), as two processes -- on two GPUs where there are two, else both on
// the one GPU (CUDA IPC maps another process's memory on the same device as well; NCCL refuses two
// ranks on one GPU, which is why this test carries its own group: the handles and barriers go
// through files). ctest entry gpu.ipc.2proc (label gpu); it forks its second process itself.
//
// For a fixture of each attention family, bf16 and f32, redundancy 0 and 2, every variant (the
// default capacity, lowlatency at 3 tokens a round, fused in chunks of 3, a promised bound, the
// fast combine) must give the logits of the single-process path (the fast combine within its
// tolerance) on scenarios A (rank 0 alone has tokens), B (a prefill on each rank) and C (three
// decode steps), and every injected bug class must change them. Then the fault drill: rank 1 stops
// after one call, and rank 0's device-side wait must name it within the timeout. A plain program
// (a table and "N passed, M failed"), as tests/ep/ep_matrix.cc.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "check/audit.h"
#include "comm/group.h"
#include "common/golden.h"
#include "ep/backend.h"
#include "ep/fault.h"
#include "ep/nccl/nccl_backends.h"
#include "io/checkpoint.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "model/cuda/gpu_model.h"
#include "model/language_model.h"

using namespace epmoe;

namespace {

// A group of processes over files in one directory: op n of rank r is `<dir>/<n>.<r>`, written
// whole (rename) and read by every rank. Slow and simple: it carries the window handles, a few
// integers per call and barriers.
class FileGroup final : public Group {
 public:
  FileGroup(std::string dir, int rank, int size) : dir_(std::move(dir)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void set_timeout(double s) override { timeout_ = s; }
  double timeout() const override { return timeout_; }
  const char* transport() const override { return "files"; }
  void barrier() override {
    char c = 0;
    std::vector<char> all(static_cast<size_t>(size_));
    allgather(&c, 1, all.data());
  }
  void allgather(const void* send, size_t bytes, void* recv) override {
    const uint64_t n = ++ops_;
    const std::string mine = path(n, rank_);
    {
      std::ofstream f(mine + ".tmp", std::ios::binary);
      f.write(static_cast<const char*>(send), std::streamsize(bytes));
    }
    std::rename((mine + ".tmp").c_str(), mine.c_str());
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < size_; r++) {
      for (;;) {
        std::ifstream f(path(n, r), std::ios::binary);
        if (f && f.read(static_cast<char*>(recv) + size_t(r) * bytes, std::streamsize(bytes))) break;
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > 60)
          abort_group("file group: rank " + std::to_string(r) + " silent in op " + std::to_string(n), 1);
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    if (n > 1) std::remove(path(n - 1, rank_).c_str());  // every rank has read it (it wrote op n)
  }
  void allgatherv(const void* send, size_t bytes, void* recv, const std::vector<size_t>& recv_bytes) override {
    size_t most = 0;
    for (size_t b : recv_bytes) most = std::max(most, b);
    std::vector<char> mine(most), all(most * size_t(size_));
    std::memcpy(mine.data(), send, bytes);
    allgather(mine.data(), most, all.data());
    char* out = static_cast<char*>(recv);
    for (int r = 0; r < size_; r++) {
      std::memcpy(out, all.data() + size_t(r) * most, recv_bytes[size_t(r)]);
      out += recv_bytes[size_t(r)];
    }
  }
  int64_t allreduce_max(int64_t v) override {
    int64_t m = INT64_MIN;
    for (int64_t x : allgather_i64(v)) m = std::max(m, x);
    return m;
  }
  int64_t allreduce_sum(int64_t v) override {
    int64_t s = 0;
    for (int64_t x : allgather_i64(v)) s += x;
    return s;
  }
  double allreduce_max_f64(double v) override {
    std::vector<double> all(static_cast<size_t>(size_));
    allgather(&v, sizeof v, all.data());
    double m = all[0];
    for (double x : all) m = std::max(m, x);
    return m;
  }
  double allreduce_sum_f64(double v) override {
    std::vector<double> all(static_cast<size_t>(size_));
    allgather(&v, sizeof v, all.data());
    double s = 0;
    for (double x : all) s += x;
    return s;
  }
  void wait_device(const char*) override { EPMOE_CUDA_CHECK(cudaStreamSynchronize(cuda::stream())); }
  [[noreturn]] void abort_group(const std::string& message, int exit_code) override {
    std::fprintf(stderr, "gpu_ipc_test: rank %d: %s\n", rank_, message.c_str());
    std::_Exit(exit_code);
  }
  uint64_t bytes_sent() const override { return 0; }
  void add_bytes_sent(uint64_t) override {}

 private:
  std::string path(uint64_t n, int r) const { return dir_ + "/" + std::to_string(n) + "." + std::to_string(r); }
  std::string dir_;
  int rank_, size_;
  double timeout_ = 30;
  uint64_t ops_ = 0;
};

// The group's fault word, as NcclGroup::device_peer_fault makes it.
int32_t* mapped_fault_word(volatile int32_t** host) {
  void* h = nullptr;
  EPMOE_CUDA_CHECK(cudaHostAlloc(&h, 16, cudaHostAllocMapped));
  std::memset(h, 0, 16);
  void* d = nullptr;
  EPMOE_CUDA_CHECK(cudaHostGetDevicePointer(&d, h, 0));
  *host = static_cast<volatile int32_t*>(h);
  return static_cast<int32_t*>(d);
}

// Scenarios A, B, C of tests/cuda/gpu_ep_test.cu: the logits this rank produced, in order.
// local_all: the single-process reference computes what every rank computes, in turn.
std::vector<std::vector<float>> run_scenarios(LanguageModel& m, A2ABackend& be, int R, int me,
                                              const std::vector<std::vector<int32_t>>& seqs, bool local_all) {
  std::vector<std::vector<float>> out;
  std::vector<int> ranks;
  if (local_all)
    for (int r = 0; r < R; r++) ranks.push_back(r);
  else
    ranks.push_back(me);
  for (int r : ranks) {
    Sequence s = m.new_sequence(0);
    std::vector<Sequence*> ss;
    std::vector<std::vector<int32_t>> tt;
    if (r == 0) ss.push_back(&s), tt.push_back(seqs[0]);
    auto l = m.forward(ss, tt, be, true);
    if (r == 0) out.push_back(l[0]);
  }
  for (int r : ranks) {
    const auto& ids = seqs[size_t(r) % seqs.size()];
    Sequence s = m.new_sequence(uint64_t(r));
    const size_t prefix = ids.size() - 3;
    out.push_back(m.forward({&s}, {{ids.begin(), ids.begin() + long(prefix)}}, be, true)[0]);
    for (size_t i = prefix; i < ids.size(); i++) out.push_back(m.forward({&s}, {{ids[i]}}, be, true)[0]);
  }
  return out;
}

struct Diff {
  bool identical = true;
  double max_diff = 0;
};
Diff compare(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want) {
  Diff d;
  if (got.size() != want.size()) return {false, INFINITY};
  for (size_t i = 0; i < got.size(); i++) {
    if (got[i].size() != want[i].size()) return {false, INFINITY};
    d.identical &= std::memcmp(got[i].data(), want[i].data(), got[i].size() * 4) == 0;
    for (size_t j = 0; j < got[i].size(); j++) d.max_diff = std::max(d.max_diff, double(std::fabs(got[i][j] - want[i][j])));
  }
  return d;
}

struct Variant {
  std::string name;
  int cap = 128, bound = 0, chunk = 64;
  bool fast = false;
  std::string label() const {
    return name + (cap != 128 ? " cap " + std::to_string(cap) : "") + (chunk != 64 ? " chunk " + std::to_string(chunk) : "") +
           (bound ? " bound " + std::to_string(bound) : "") + (fast ? " --combine fast" : "");
  }
};

int run_rank(const std::string& dir, int me) {
  const int R = 2;
  cuda::init_device(me);
  FileGroup g(dir, me, R);
  volatile int32_t* fault_host = nullptr;
  int32_t* fault_dev = mapped_fault_word(&fault_host);
  int passed = 0, failed = 0;
  auto report = [&](bool ok, const std::string& what) {
    // Both ranks must agree: a case passes when it passed on every rank.
    const bool all = g.allreduce_sum(ok ? 0 : 1) == 0;
    (all ? passed : failed)++;
    if (me == 0) std::printf("%-4s %s\n", all ? "ok" : "FAIL", what.c_str());
    std::fflush(stdout);
  };
  const std::vector<Variant> variants = {{"onesided"},
                                         {"onesided", 128, 64},
                                         {"onesided", 128, 0, 64, true},
                                         {"lowlatency"},
                                         {"lowlatency", 3},
                                         {"lowlatency", 64, 64},
                                         {"fused"},
                                         {"fused", 128, 0, 3},
                                         {"fused", 128, 64, 64}};
  for (const std::string fx : {"qwen3moe-tiny", "deepseek-v2-tiny", "deepseek-v3-fp8-tiny"}) {
    ModelConfig cfg = load_model_config(test::fixture(fx));
    Checkpoint ckpt(test::fixture(fx));
    test::Golden gold(fx);
    std::vector<std::vector<int32_t>> seqs;
    for (int s = 0; s < gold.sequences(); s++) seqs.push_back(gold.ids("seq" + std::to_string(s) + ".all_ids"));
    const int E = cfg.routing.num_experts;
    for (bool f32 : {false, true}) {
      GpuModelOptions mo;
      mo.f32 = f32;
      for (int red : {0, 2}) {
        std::vector<std::vector<float>> ref;
        {
          Placement solo = Placement::make_default(E, 1, red);
          auto refm = make_gpu_model(cfg, ckpt, solo, 0, mo);
          auto local = make_local_backend(Device::Cuda, solo);
          auto all = run_scenarios(*refm, *local, R, me, seqs, true);
          if (me == 0) ref.push_back(all[0]);
          for (size_t i = 0; i < 4; i++) ref.push_back(all[1 + size_t(me) * 4 + i]);
        }
        Placement pl = Placement::make_default(E, R, red);
        auto m = make_gpu_model(cfg, ckpt, pl, me, mo);
        const std::string where = fx + (f32 ? " f32" : " bf16") + " redundant " + std::to_string(red) + " ";
        for (const Variant& v : variants) {
          BackendOptions bo;
          bo.max_dispatch_tokens_per_rank = v.cap;
          bo.max_tokens_per_rank = v.bound;
          bo.chunk_tokens = v.chunk;
          bo.combine = v.fast ? CombineMode::Fast : CombineMode::Deterministic;
          auto be = make_ipc_backend(v.name, g, fault_dev, pl, bo);
          const int64_t replays0 = gpu_graph_stats(*m).replays;
          const Diff d = compare(run_scenarios(*m, *be, R, me, seqs, false), ref);
          const int64_t replays = gpu_graph_stats(*m).replays - replays0;
          const double tol = f32 ? 1e-5 : 1e-3;  // the fast combine's (as tests/cuda/gpu_ep_test.cu)
          char buf[200];
          std::snprintf(buf, sizeof buf, "%s(max |diff| %.3g; %lld decode steps replayed as CUDA graphs)",
                        v.fast ? "within tolerance " : "bit-identical ", d.max_diff, (long long)replays);
          report(v.fast ? d.max_diff <= tol : d.identical, where + v.label() + ": " + buf);
          // Under a promised bound that fits one round, the decode steps (scenario C: one eager,
          // then a capture and a replay) run as graphs through the backend.
          if (be->graph_capturable()) report(replays > 0, where + v.label() + ": decode steps replayed as graphs");
          if (v.bound || v.fast) continue;
          for (Fault f : {Fault::DoubleReduce, Fault::SkipReduce, Fault::ReplicaPerRank, Fault::WrongCombineIds,
                          Fault::DropOverflow}) {
            if (f == Fault::ReplicaPerRank && red == 0) continue;
            if (f == Fault::DropOverflow && !(v.name == "lowlatency" && v.cap == 3)) continue;
            BackendOptions fo = bo;
            fo.fault = f;
            auto fb = make_ipc_backend(v.name, g, fault_dev, pl, fo);
            const Diff fd = compare(run_scenarios(*m, *fb, R, me, seqs, false), ref);
            const bool changed = g.allreduce_sum(fd.identical ? 0 : 1) > 0;
            report(changed, where + v.label() + " --inject " + fault_name(f) + (changed ? ": caught" : ": MISSED"));
          }
        }
        report(fault_host[0] == 0, where + "no device wait timed out");
      }
    }
  }

  // The reduction audit of `epmoe check` (probe experts, the CPU's diagnoses) over each backend:
  // a clean run passes, each injected bug class fails with the verdict the CPU gives it
  // (tests/check/check_test.cc); drop-overflow exists only in the bounded lowlatency.
  {
    const Placement pl = Placement::make_default(16, R, 2);
    const std::vector<std::pair<Fault, std::string>> faults = {
        {Fault::None, "ok"},
        {Fault::DoubleReduce, "reduced twice"},
        {Fault::SkipReduce, "not reduced"},
        {Fault::ReplicaPerRank, "replica counted twice"},
        {Fault::WrongCombineIds, "rows of another token"},
        {Fault::DropOverflow, "slot lost"}};
    for (const Variant& v : {Variant{"onesided"}, Variant{"lowlatency", 3}, Variant{"fused", 128, 0, 3}})
      for (const auto& [f, verdict] : faults) {
        BackendOptions bo;
        bo.max_dispatch_tokens_per_rank = v.cap;
        bo.chunk_tokens = v.chunk;
        bo.fault = f;
        auto be = make_ipc_backend(v.name, g, fault_dev, pl, bo);
        AuditOptions ao = make_audit_options(64, 4, bo, R);
        ao.tokens_per_rank = 8;  // more than a lowlatency round (3) and a fused chunk (3)
        const AuditResult a = run_audit(g, Device::Cuda, pl, *be, ao);
        const bool applies = f != Fault::DropOverflow || v.name == "lowlatency";
        const std::string want = applies ? verdict : "ok";
        const bool ok = a.verdict.rfind(want, 0) == 0 && a.pass == (want == "ok");
        report(ok, "audit " + v.label() + (f == Fault::None ? "" : " --inject " + fault_name(f)) + ": " + a.verdict +
                       (ok ? "" : " (want " + want + ")"));
      }
  }

  // The fault drill: rank 1 stops after one call of onesided (bound: no host-side agreement); rank
  // 0's next call must end within the timeout with the fault word naming rank 1.
  {
    g.set_timeout(3);
    ModelConfig cfg = load_model_config(test::fixture("qwen3moe-tiny"));
    Checkpoint ckpt(test::fixture("qwen3moe-tiny"));
    Placement pl = Placement::make_default(cfg.routing.num_experts, R, 0);
    auto m = make_gpu_model(cfg, ckpt, pl, me, {});
    BackendOptions bo;
    bo.max_tokens_per_rank = 16;
    auto be = make_ipc_backend("onesided", g, fault_dev, pl, bo);
    Sequence s = m->new_sequence(uint64_t(me));
    m->forward({&s}, {{5, 17, 42}}, *be, true);
    g.barrier();
    if (me == 1) {
      g.barrier();  // until rank 0 has seen its verdict
      return 0;
    }
    const auto t0 = std::chrono::steady_clock::now();
    Sequence s2 = m->new_sequence(7);
    m->forward({&s2}, {{5, 17, 42}}, *be, true);  // waits on the device, then gives up
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const bool named = fault_host[0] == 1 && fault_host[1] == 1;
    char buf[200];
    std::snprintf(buf, sizeof buf, "fault drill: rank 1 stopped; rank 0 %s after %.1f s (timeout 3 s, stage %d)",
                  named ? "named rank 1" : "did NOT name rank 1", took, int(fault_host[2]));
    (named && took < 30 ? passed : failed)++;
    std::printf("%-4s %s\n", named && took < 30 ? "ok" : "FAIL", buf);
    g.barrier();
  }
  if (me == 0) std::printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

}  // namespace

int main() {
  char tmpl[] = "/tmp/epmoe-ipc-test.XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  std::fflush(stdout);
  const pid_t child = fork();  // before any CUDA context: the child starts clean
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  const int me = child == 0 ? 1 : 0;
  int rc = 1;
  try {
    // (Only after the fork: a process that has touched CUDA cannot hand it to a child.)
    std::string why;
    if (cuda::visible_devices(&why) == 0) {
      if (me == 0) std::printf("no CUDA device visible: %s\n", why.c_str());
      rc = 0;
    } else {
      rc = run_rank(dir, me);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_ipc_test: rank %d: %s\n", me, e.what());
    rc = 1;
  }
  if (me == 1) std::_Exit(rc);
  int st = 0;
  waitpid(child, &st, 0);
  const int child_rc = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
  std::system(("rm -rf " + dir).c_str());
  return rc || child_rc ? 1 : 0;
}
