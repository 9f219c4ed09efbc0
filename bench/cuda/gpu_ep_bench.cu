// Dispatch + combine on GPUs (issues 10 and 19), one process per GPU under
// scripts/gpu-launch.sh: T tokens per rank (128, 1024, 4096), hidden 2048, top-8 of 128 experts,
// bf16 rows, uniform random routing. The experts are replaced by the plan alone (no GEMMs), so
// the time is the backend's: planning, packing, the exchanges and the combine. Beside it, a raw
// NCCL all-to-all (grouped ncclSend/ncclRecv, equal chunks) moving the same bytes per rank as the
// alltoall backend (dispatch + combine). Median wall time of 20 runs, after 3 warm-ups.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>

#include <csignal>
#include <vector>

#include <nccl.h>

#include "comm/nccl_group.h"
#include "ep/backend.h"
#include "ep/cuda/expert_plan.cuh"
#include "kernels/cuda/ops.cuh"

using namespace epmoe;
using namespace epmoe::cuda;

namespace {

constexpr int H = 2048, E = 128, K = 8;

// The expert side without the GEMMs: the plan (grouping, compact indices) only.
class PlanOnly final : public ExpertRunner {
 public:
  PlanOnly(int p0, int n) : p0_(p0), n_(n) {}
  Device device() const override { return Device::Cuda; }
  void run(const ExpertJobs& j, void*) override { plan_.make(j, p0_, n_, /*tiled=*/false); }

 private:
  int p0_, n_;
  ExpertPlanGpu plan_;
};

template <class F>
double median_us(F&& f, int iters) {
  std::vector<double> us;
  for (int i = 0; i < iters + 3; i++) {
    EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
    const auto t0 = std::chrono::steady_clock::now();
    f();
    EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
    const double d = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 3) us.push_back(d);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    NcclGroup& g = NcclGroup::world();
    const int R = g.size(), me = g.rank();
    FILE* f = nullptr;
    std::vector<int> Ts = {128, 1024, 4096};
    bool ll_full = true;  // the lowlatency variant whose capacity holds every token in one round
    // --stop-rank R --stop-how hang|kill: a fault drill instead of the benchmark. After one call of
    // onesided (--stop-backend) has mapped every peer, rank R stops: it sleeps (the others' device
    // waits must give up within the group's timeout, naming rank R), or it is killed (SIGKILL: the
    // launcher ends the group at once with its exit code).
    int stop_rank = -1;
    std::string stop_how = "hang", stop_backend = "onesided";
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string a = argv[i], v = argv[i + 1];
      if (a == "--out" && me == 0) f = std::fopen(v.c_str(), "w");
      if (a == "--t") Ts = {std::stoi(v)};
      if (a == "--ll-full") ll_full = v != "0";
      if (a == "--stop-rank") stop_rank = std::stoi(v);
      if (a == "--stop-how") stop_how = v;
      if (a == "--stop-backend") stop_backend = v;
    }
    if (f) std::fprintf(f, "tokens_per_rank\tbackend\tus\tbytes_sent_per_rank\traw_us\tratio\n");
    Placement pl = Placement::make_default(E, R, 0);
    PlanOnly runner(pl.first_local(me), pl.num_local(me));
    if (me == 0) {
      std::printf("| tokens/rank | backend | dispatch+combine us | bytes sent/rank | raw NCCL a2a us (same bytes) | ratio |\n");
      std::printf("|---|---|---|---|---|---|\n");
    }
    for (int T : Ts) {
      DeviceArray<bf16> x(size_t(T) * H);
      fill_random(x.data(), int64_t(T) * H, 7 + me, 1.0f, stream());
      std::mt19937 rng(1234 + me);
      std::vector<int32_t> ph(size_t(T) * K);
      std::vector<float> w(size_t(T) * K, 1.0f / K);
      for (int t = 0; t < T; t++) {
        std::vector<int> e(E);
        for (int i = 0; i < E; i++) e[size_t(i)] = i;
        std::shuffle(e.begin(), e.end(), rng);
        for (int k = 0; k < K; k++) ph[size_t(t * K + k)] = e[size_t(k)];
      }
      DeviceArray<int32_t> dph;
      dph.upload(ph);
      DeviceArray<float> dw, y(size_t(T) * H);
      dw.upload(w);
      MoeTokens tok;
      tok.device = Device::Cuda, tok.act = DType::BF16;
      tok.T = T, tok.H = H, tok.K = K, tok.x = x.data(), tok.physical = dph.data(), tok.weights = dw.data();
      double a2a_bytes = 0;
      if (stop_rank >= 0) {
        BackendOptions bo;
        bo.max_tokens_per_rank = T;  // no host-side agreement: the wait is on the device
        auto be = make_backend(stop_backend, Device::Cuda, g, pl, bo);
        be->run(tok, runner, y.data());
        g.sync("fault drill: first call");
        if (me == stop_rank) {
          std::fprintf(stderr, "gpu_ep_bench: rank %d stops (%s)\n", me, stop_how.c_str());
          if (stop_how == "kill") raise(SIGKILL);
          for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
        }
        be->run(tok, runner, y.data());
        g.sync("fault drill: second call");
        std::fprintf(stderr, "gpu_ep_bench: rank %d: the second call returned without rank %d\n", me, stop_rank);
        return 3;
      }
      // Every GPU backend, lowlatency also with a capacity that holds every token in one round,
      // onesided also with its bound promised (no per-call agreement), and the fast combine.
      struct Variant {
        std::string name;
        int cap = 128, bound = 0;
        bool fast = false;
      };
      std::vector<Variant> variants = {{"none"}, {"alltoall"}, {"alltoall", 128, 0, true}, {"lowlatency"}};
      if (ll_full && T > 128) variants.push_back({"lowlatency", T});
      variants.push_back({"onesided"});
      variants.push_back({"onesided", 128, T});
      variants.push_back({"onesided", 128, T, true});
      variants.push_back({"fused", 128, T});  // chunks of T/4 tokens, pipelined over two streams
      std::vector<std::pair<std::string, std::pair<double, double>>> res;
      for (const Variant& v : variants) {
        const std::string label = v.name + (v.name == "fused" ? " (4 chunks)" : "") +
                                  (v.cap != 128 ? " (cap " + std::to_string(v.cap) + ")" : "") +
                                  (v.bound ? " (bound)" : "") + (v.fast ? " --combine fast" : "");
        if (me == 0) std::fprintf(stderr, "gpu_ep_bench: T=%d %s\n", T, label.c_str());
        BackendOptions bo;
        bo.max_dispatch_tokens_per_rank = v.cap;
        bo.max_tokens_per_rank = v.bound;
        bo.chunk_tokens = std::max(1, T / 4);
        bo.combine = v.fast ? CombineMode::Fast : CombineMode::Deterministic;
        auto be = make_backend(v.name, Device::Cuda, g, pl, bo);
        be->run(tok, runner, y.data());  // allocate
        const uint64_t b0 = g.bytes_sent();
        be->run(tok, runner, y.data());
        const double sent = double(g.bytes_sent() - b0);
        const double us = median_us([&] { be->run(tok, runner, y.data()); }, 20);
        if (v.name == "alltoall" && !v.fast) a2a_bytes = sent;
        std::fprintf(stderr, "gpu_ep_bench: rank %d: T=%d %s: %.0f us\n", me, T, label.c_str(), us);
        res.push_back({label, {us, sent}});
      }
      // Raw NCCL all-to-all: the bytes the alltoall backend sent to other ranks (the most any rank
      // sent), in equal chunks to every other rank (grouped ncclSend/ncclRecv). Every rank must use
      // the same chunk size: a send and its receive of different counts never complete (run 5 of
      // docs/gpu.md hung at 4096 tokens/rank for that reason: each rank sized by its own bytes).
      a2a_bytes = double(g.allreduce_max(int64_t(a2a_bytes)));
      const size_t per_peer = size_t(a2a_bytes / std::max(1, R - 1) / 16) * 16 + 16;
      DeviceArray<unsigned char> sb(per_peer * size_t(R)), rb(per_peer * size_t(R));
      auto comm = static_cast<ncclComm_t>(g.nccl_comm());
      auto ok = [](ncclResult_t r) {
        if (r != ncclSuccess) throw Error(std::string("raw all-to-all: ") + ncclGetErrorString(r));
      };
      const double raw = median_us(
          [&] {
            if (R == 1) return;
            ok(ncclGroupStart());
            for (int d = 0; d < R; d++) {
              if (d == me) continue;
              ok(ncclSend(sb.data() + size_t(d) * per_peer, per_peer, ncclChar, d, comm, stream()));
              ok(ncclRecv(rb.data() + size_t(d) * per_peer, per_peer, ncclChar, d, comm, stream()));
            }
            ok(ncclGroupEnd());
            g.sync("raw all-to-all");
          },
          20);
      for (auto& [name, v] : res) {
        const double us = double(g.allreduce_max(int64_t(v.first)));  // the slowest rank
        if (me == 0) {
          // (The onesided backends write peers' memory from kernels: the group's byte counter does
          // not see them.)
          // One rank has no all-to-all to compare with: the figure is the backend's local floor
          // (plan, pack, combine), and the raw and ratio columns say so instead of dividing by ~0.
          const std::string raw_s = R > 1 ? std::to_string(int64_t(raw + 0.5)) : "-";
          char ratio_s[32] = "-";
          if (R > 1 && raw > 0) std::snprintf(ratio_s, sizeof ratio_s, "%.2f", us / raw);
          std::printf("| %d | %s | %.0f | %s | %s | %s |\n", T, name.c_str(), us,
                      v.second > 0 ? std::to_string(int64_t(v.second)).c_str() : "-", raw_s.c_str(), ratio_s);
          if (f) std::fprintf(f, "%d\t%s\t%.1f\t%.6g\t%.1f\t%.3f\n", T, name.c_str(), us, v.second, R > 1 ? raw : 0.0,
                              R > 1 && raw > 0 ? us / raw : 0.0);
          std::fflush(stdout);
          if (f) std::fflush(f);
        }
      }
    }
    if (f) std::fclose(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_ep_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
