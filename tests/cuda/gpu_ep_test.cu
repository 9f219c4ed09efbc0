// Expert parallelism on GPUs (issue 10), run by scripts/gpu-test.sh under scripts/gpu-launch.sh
// (one process per GPU). For every fixture, --compute bf16 and f32, redundancy 0 and 2, and every
// backend over NCCL (lowlatency also with a capacity of 3 tokens, so that it runs several
// rounds): the logits are bit-identical to the single-GPU run of the same sequences on
//   A  rank 0's sequence while the other ranks have no tokens (score)
//   B  a different sequence on every rank (prefill)
//   C  then three decode steps of one token each
// and an injected double reduce (the bug class of sglang #34006) must change them (the check
// catches it). Rank 0 prints the table; exit status 0 when all pass on every rank.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/golden.h"
#include "cuda/model.h"
#include "ep/fault.h"
#include "io/checkpoint.h"

using namespace epmoe;
using namespace epmoe::cuda;

namespace {

struct Outcome {
  bool identical = true;
  double max_diff = 0;
  void add(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) {
      identical = false;
      max_diff = INFINITY;
      return;
    }
    if (std::memcmp(a.data(), b.data(), a.size() * 4) != 0) identical = false;
    for (size_t i = 0; i < a.size(); i++) max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
  }
};

// Runs scenarios A, B, C on `m` with `be`; returns the logits this rank produced, in order.
std::vector<std::vector<float>> run_scenarios(GpuModel& m, GpuBackend& be, GpuGroup& g,
                                              const std::vector<std::vector<int32_t>>& seqs, bool local_all) {
  // local_all: the single-GPU reference computes what every rank computes in turn (same ids).
  std::vector<std::vector<float>> out;
  const int R = g.size();
  auto ranks = local_all ? std::vector<int>{} : std::vector<int>{g.rank()};
  if (local_all)
    for (int r = 0; r < R; r++) ranks.push_back(r);
  // A: rank 0 only.
  for (int r : ranks) {
    GpuSequence s = m.new_sequence(0);
    std::vector<GpuSequence*> ss;
    std::vector<std::vector<int32_t>> tt;
    if (r == 0) ss.push_back(&s), tt.push_back(seqs[0]);
    auto l = m.forward(ss, tt, be, true);
    if (r == 0) out.push_back(l[0]);
  }
  // B + C: sequence r mod n on rank r, id r; prefill of all but 3 tokens, then one at a time.
  for (int r : ranks) {
    const auto& ids = seqs[size_t(r) % seqs.size()];
    GpuSequence s = m.new_sequence(uint64_t(r));
    const size_t prefix = ids.size() - 3;
    out.push_back(m.forward({&s}, {{ids.begin(), ids.begin() + long(prefix)}}, be, true)[0]);
    for (size_t i = prefix; i < ids.size(); i++) out.push_back(m.forward({&s}, {{ids[i]}}, be, true)[0]);
  }
  return out;
}

}  // namespace

int main() {
  int fails = 0;
  try {
    GpuGroup& g = GpuGroup::world();
    const int R = g.size(), me = g.rank();
    if (me == 0) std::printf("gpu_ep_test: %d GPU process(es)\n", R);
    std::vector<std::string> rows;
    for (const auto& fx : test::all_model_fixtures()) {
      ModelConfig cfg = load_model_config(test::fixture(fx));
      Checkpoint ckpt(test::fixture(fx));
      test::Golden gold(fx);
      std::vector<std::vector<int32_t>> seqs;
      for (int s = 0; s < gold.sequences(); s++) seqs.push_back(gold.ids("seq" + std::to_string(s) + ".all_ids"));
      const int E = cfg.routing.num_experts;
      for (bool f32 : {false, true}) {
        GpuOptions go;
        go.f32 = f32;
        for (int red : {0, 2}) {
          Placement ref_pl = Placement::make_default(E, 1, red);
          std::vector<std::vector<float>> ref;
          {
            GpuModel refm(cfg, ckpt, ref_pl, 0, go);
            auto local = make_local_gpu_backend(ref_pl);
            auto all = run_scenarios(refm, *local, g, seqs, /*local_all=*/true);
            // Keep what this rank will compute: A (rank 0 only), then B+C of this rank.
            const size_t per = 4;  // prefill + 3 decode steps
            if (me == 0) ref.push_back(all[0]);
            for (size_t i = 0; i < per; i++) ref.push_back(all[1 + size_t(me) * per + i]);
          }
          Placement pl = Placement::make_default(E, R, red);
          GpuModel m(cfg, ckpt, pl, me, go);
          std::vector<std::pair<std::string, int>> variants;
          for (auto& n : gpu_backend_names()) variants.push_back({n, 128});
          variants.push_back({"lowlatency", 3});
          for (auto& [name, cap] : variants) {
            GpuBackendOptions bo;
            bo.max_dispatch_tokens_per_rank = cap;
            auto be = make_gpu_backend(name, g, pl, bo);
            auto got = run_scenarios(m, *be, g, seqs, false);
            Outcome o;
            for (size_t i = 0; i < got.size(); i++) o.add(got[i], i < ref.size() ? ref[i] : std::vector<float>{});
            if (got.size() != ref.size()) o.identical = false;
            const int bad = int(g.allreduce_sum(o.identical ? 0 : 1));
            std::vector<int64_t> diffs = g.allgather(int64_t(std::llround(o.max_diff * 1e9)));
            double worst = 0;
            for (auto d : diffs) worst = std::max(worst, double(d) * 1e-9);
            // The checker must catch an injected double reduce (changes nothing with one rank).
            std::string caught = "n/a";
            if (R > 1 && name == "alltoall" && cap == 128) {
              set_injected_fault(Fault::DoubleReduce);
              auto faulty = run_scenarios(m, *be, g, seqs, false);
              set_injected_fault(Fault::None);
              Outcome f;
              for (size_t i = 0; i < faulty.size(); i++) f.add(faulty[i], ref[i]);
              const int differs = int(g.allreduce_sum(f.identical ? 0 : 1));
              caught = differs > 0 ? "caught" : "MISSED";
              if (differs == 0) fails++;
            }
            if (bad) fails++;
            char buf[300];
            std::snprintf(buf, sizeof buf, "| %s | %s | %d | %s%s | %s | %.3g | %s |", fx.c_str(), f32 ? "f32" : "bf16",
                          red, name.c_str(), cap != 128 ? " (cap 3)" : "", bad ? "NO" : "yes", worst, caught.c_str());
            rows.push_back(buf);
          }
        }
      }
    }
    if (me == 0) {
      std::printf("\n| fixture | compute | redundant | backend | bit-identical to 1 GPU (all ranks, A+B+C) | max |diff| | double reduce |\n");
      std::printf("|---|---|---|---|---|---|---|\n");
      for (auto& r : rows) std::printf("%s\n", r.c_str());
    }
    const int64_t total = g.allreduce_sum(fails);
    if (me == 0) std::printf("\n%s: %lld failure(s)\n", total ? "FAILED" : "PASSED", (long long)total);
    return total ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_ep_test: %s\n", e.what());
    return 1;
  }
}
