// The expert-parallel matrix, run under mpirun by ctest (one process per rank):
//
//   mpirun -np R ep_matrix FIXTURE
//
// For every backend x combine mode x redundant experts {0, 2, 5} x routing {the model's own,
// collapsed: every token to the same experts} x sequences {spread over all ranks, one rank left
// with zero tokens}, the logits of prefill and three greedy decode steps are compared with the
// single-process reference (all experts local, no backend), computed by each rank for its own
// sequences: deterministic combine must be bit-identical (memcmp), fast within 1e-5. The
// low-latency capacity is set below the tokens per rank, so overflow rounds always run. Routing
// replay (R3), per backend: the routing captured on R ranks is the single process's, and a
// re-score of prompt + output with it replayed gives the rollout's logits bit for bit.
// Prints one line per case and "N passed, N failed"; exit 1 on any failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "comm/mpi_group.h"
#include "ep/backend.h"
#include "io/checkpoint.h"
#include "io/json_util.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "util/error.h"

using namespace epmoe;

namespace {

// A copy of the model whose routers are all zero (and correction biases zero): every router
// logit ties, so top-k picks the same experts for every token -- the most unbalanced load.
std::string write_collapsed_copy(const std::string& dir, const std::string& out) {
  std::filesystem::create_directories(out);
  std::filesystem::copy_file(dir + "/config.json", out + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  Checkpoint ck(dir);
  std::vector<std::vector<char>> zeros;
  std::vector<TensorToWrite> tensors;
  for (auto& name : ck.names()) {
    TensorView v = ck.get(name);
    const bool router = name.find(".gate.weight") != std::string::npos || name.find("e_score_correction_bias") != std::string::npos;
    if (router && name.find("shared_expert_gate") == std::string::npos) {
      zeros.emplace_back(v.nbytes(), 0);
      tensors.push_back({name, v.dtype, v.shape, zeros.back().data()});
    } else {
      tensors.push_back({name, v.dtype, v.shape, v.data});
    }
  }
  write_safetensors(out + "/model.safetensors", tensors);
  return out;
}

struct Case {
  std::string backend;
  CombineMode combine;
  int redundant;
  bool collapsed;
  bool zero_token_rank;
};

// Runs this rank's sequences: prefill with all logits, then `steps` greedy steps; returns every
// logit produced, per sequence, concatenated.
std::vector<std::vector<float>> run(Model& m, A2ABackend& be, MpiGroup& comm,
                                    const std::vector<std::pair<uint64_t, std::vector<int32_t>>>& mine, int steps) {
  std::vector<Sequence> seqs;
  std::vector<Sequence*> ptrs;
  std::vector<std::vector<int32_t>> toks;
  for (auto& [id, p] : mine) seqs.push_back(m.new_sequence(id));
  for (size_t i = 0; i < mine.size(); i++) {
    ptrs.push_back(&seqs[i]);
    toks.push_back(mine[i].second);
  }
  std::vector<std::vector<float>> all(mine.size());
  const int64_t V = m.config().vocab_size;
  for (int s = 0; s <= steps; s++) {
    auto logits = m.forward(ptrs, toks, be, /*all_logits=*/true);
    for (size_t i = 0; i < mine.size(); i++) {
      all[i].insert(all[i].end(), logits[i].begin(), logits[i].end());
      toks[i] = {argmax(logits[i].data() + logits[i].size() - size_t(V), V)};
    }
  }
  (void)comm;
  return all;
}

// Routing replay (R3): a rollout of this rank's sequences (prefill, then `steps` greedy steps) with
// every step's routing captured, then one re-score of each sequence's fed tokens with that routing
// replayed. Returns the captured routing and the rollout's logits, and whether the re-score gave
// the rollout's logits bit for bit.
struct ReplayRun {
  std::vector<std::vector<int32_t>> ids;  // per sequence: [fed tokens][moe layers][K]
  std::vector<std::vector<float>> weights;
  bool rescore_bits = true;
};
ReplayRun replay_run(Model& m, A2ABackend& be, const std::vector<std::pair<uint64_t, std::vector<int32_t>>>& mine,
                     int steps) {
  const size_t n = mine.size();
  std::vector<Sequence> seqs;
  std::vector<Sequence*> ptrs;
  std::vector<std::vector<int32_t>> toks, fed(n);
  std::vector<std::vector<float>> logits_all(n);
  ReplayRun out;
  out.ids.resize(n), out.weights.resize(n);
  for (auto& [id, p] : mine) seqs.push_back(m.new_sequence(id));
  for (size_t i = 0; i < n; i++) ptrs.push_back(&seqs[i]), toks.push_back(mine[i].second);
  const int64_t V = m.config().vocab_size;
  StepRouting cap;
  for (int s = 0; s <= steps; s++) {
    ForwardOptions opt;
    opt.capture = &cap;
    auto logits = m.forward(ptrs, toks, be, /*all_logits=*/true, opt);
    const size_t per = size_t(cap.moe_layers) * size_t(cap.K);
    size_t t0 = 0;
    for (size_t i = 0; i < n; i++) {
      fed[i].insert(fed[i].end(), toks[i].begin(), toks[i].end());
      out.ids[i].insert(out.ids[i].end(), cap.ids.begin() + long(t0 * per), cap.ids.begin() + long((t0 + toks[i].size()) * per));
      out.weights[i].insert(out.weights[i].end(), cap.weights.begin() + long(t0 * per),
                            cap.weights.begin() + long((t0 + toks[i].size()) * per));
      t0 += toks[i].size();
      logits_all[i].insert(logits_all[i].end(), logits[i].begin(), logits[i].end());
      toks[i] = {argmax(logits[i].data() + logits[i].size() - size_t(V), V)};
    }
  }
  // The re-score: every sequence's fed tokens in one step, the captured routing replayed.
  std::vector<Sequence> again;
  std::vector<Sequence*> again_ptrs;
  StepRouting rep;
  rep.moe_layers = cap.moe_layers, rep.K = cap.K;
  for (size_t i = 0; i < n; i++) {
    again.push_back(m.new_sequence(mine[i].first));
    rep.ids.insert(rep.ids.end(), out.ids[i].begin(), out.ids[i].end());
    rep.weights.insert(rep.weights.end(), out.weights[i].begin(), out.weights[i].end());
  }
  for (auto& q : again) again_ptrs.push_back(&q);
  ForwardOptions opt;
  opt.replay = &rep;
  auto scored = m.forward(again_ptrs, fed, be, /*all_logits=*/true, opt);
  for (size_t i = 0; i < n; i++)
    out.rescore_bits &= scored[i].size() == logits_all[i].size() &&
                        std::memcmp(scored[i].data(), logits_all[i].data(), scored[i].size() * sizeof(float)) == 0;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  MpiGroup& comm = MpiGroup::world();
  comm.set_timeout(60);
  if (argc < 2) {
    std::fprintf(stderr, "usage: mpirun -np R ep_matrix MODEL_DIR [TMP_DIR]\n");
    return 2;
  }
  const std::string model_dir = argv[1];
  const std::string tmp = argc > 2 ? argv[2] : std::filesystem::temp_directory_path().string();
  const int R = comm.size(), me = comm.rank();
  int passed = 0, failed = 0;
  try {
    const std::string name = std::filesystem::path(model_dir).filename().string();
    const std::string collapsed_dir = tmp + "/ep_matrix_collapsed_" + name + "_R" + std::to_string(R);
    if (me == 0) write_collapsed_copy(model_dir, collapsed_dir);
    comm.barrier();

    for (bool collapsed : {false, true}) {
      const std::string dir = collapsed ? collapsed_dir : model_dir;
      ModelConfig cfg = load_model_config(dir);
      Checkpoint ck(dir);
      const int E = cfg.routing.num_experts;
      Placement ref_place = Placement::make_default(E, 1, 0);
      Model ref(cfg, ck, ref_place, 0, ComputeMode::F32);
      auto local = make_local_backend(Device::Cpu, ref_place);

      for (bool zero_rank : {false, true}) {
        // Sequences of varied lengths; with zero_rank, rank R-1 gets none (R >= 2).
        const int nseq = zero_rank ? std::max(1, R - 1) : 2 * R + 1;
        std::mt19937 rng(1234 + unsigned(nseq));
        std::vector<std::pair<uint64_t, std::vector<int32_t>>> mine;
        for (int i = 0; i < nseq; i++) {
          std::vector<int32_t> p(size_t(1 + (i * 7) % 23));
          for (auto& t : p) t = int32_t(rng() % unsigned(cfg.vocab_size));
          if (i % R == me) mine.push_back({uint64_t(i), p});
        }
        auto want = run(ref, *local, comm, mine, 3);
        // The single process's routing of the same rollout: what every backend's capture must equal.
        const ReplayRun ref_routing = collapsed ? ReplayRun{} : replay_run(ref, *local, mine, 3);

        for (int redundant : {0, 2, 5}) {
          if (redundant > E) continue;
          Placement place = Placement::make_default(E, R, redundant);
          Model m(cfg, ck, place, me, ComputeMode::F32);
          for (const std::string& backend : backend_names(Device::Cpu))
            for (CombineMode mode : {CombineMode::Deterministic, CombineMode::Fast}) {
              BackendOptions opt;
              opt.combine = mode;
              opt.max_dispatch_tokens_per_rank = 4;  // below the tokens per rank: overflow rounds
              opt.chunk_tokens = 5;
              auto be = make_backend(backend, Device::Cpu, comm, place, opt);
              auto got = run(m, *be, comm, mine, 3);
              float maxdiff = 0.f;
              bool identical = true;
              for (size_t i = 0; i < got.size(); i++) {
                if (got[i].size() != want[i].size()) {
                  identical = false;
                  maxdiff = INFINITY;
                  continue;
                }
                identical &= std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)) == 0;
                for (size_t j = 0; j < got[i].size(); j++) maxdiff = std::max(maxdiff, std::fabs(got[i][j] - want[i][j]));
              }
              const bool ok_here = mode == CombineMode::Deterministic ? identical : maxdiff <= 1e-5f;
              const int64_t bad = comm.allreduce_sum(ok_here ? 0 : 1);
              const double worst = comm.allreduce_max_f64(double(maxdiff));
              const int64_t any_diff = comm.allreduce_max(identical ? 0 : 1);
              if (me == 0)
                std::printf("%-4s %s R=%d %-10s %-13s redundant=%d routing=%-9s ranks=%-11s max|diff|=%.3g %s\n",
                            bad ? "FAIL" : "ok", name.c_str(), R, backend.c_str(),
                            mode == CombineMode::Deterministic ? "deterministic" : "fast", redundant,
                            collapsed ? "collapsed" : "model", zero_rank ? "one-idle" : "all-busy", worst,
                            any_diff ? "" : "(bit-identical)");
              (bad ? failed : passed)++;
              // Routing replay (deterministic combine, the model's routing, 2 redundant experts):
              // each rank's captured routing is the single process's (ids and weight bits), and
              // re-scoring with it replayed gives the rollout's logits bit for bit.
              if (mode == CombineMode::Deterministic && !collapsed && redundant == std::min(2, E)) {
                const ReplayRun rr = replay_run(m, *be, mine, 3);
                bool same = rr.rescore_bits;
                for (size_t i = 0; i < mine.size(); i++)
                  same &= rr.ids[i] == ref_routing.ids[i] && rr.weights[i].size() == ref_routing.weights[i].size() &&
                          std::memcmp(rr.weights[i].data(), ref_routing.weights[i].data(),
                                      rr.weights[i].size() * sizeof(float)) == 0;
                const int64_t rbad = comm.allreduce_sum(same ? 0 : 1);
                if (me == 0)
                  std::printf("%-4s %s R=%d %-10s routing replay: captured == single process, re-score == rollout "
                              "(bits), ranks=%s\n",
                              rbad ? "FAIL" : "ok", name.c_str(), R, backend.c_str(), zero_rank ? "one-idle" : "all-busy");
                (rbad ? failed : passed)++;
              }
            }
        }
      }
    }
  } catch (const Error& e) {
    comm.abort_group(e.what(), e.exit_code());
  }
  if (me == 0) std::printf("%d passed, %d failed\n", passed, failed);
  MpiGroup::finalize();
  return failed ? 1 : 0;
}
