#include "moe/moe_layer.h"

#include <cmath>
#include <optional>

#include "ep/cpu_expert_jobs.h"
#include "kernels/matmul.h"
#include "moe/moe_block.h"
#include "util/error.h"
#include "util/stage_clock.h"

namespace epmoe {

void CpuExpertRunner::run(const ExpertJobs& jobs, void* out) {
  auto expert = [this](int physical, const float* in, int64_t n, float* y) {
    const int logical = placement_.logical_of[size_t(physical)];
    auto it = w_.experts.find(logical);
    EPMOE_ASSERT(it != w_.experts.end(),
                 "expert " + std::to_string(logical) + " (physical " + std::to_string(physical) +
                     ") asked of a rank that does not hold its weights");
    swiglu_forward(it->second, in, n, y, compute_);
  };
  run_jobs_grouped(jobs, H_, placement_.first_local(rank_), placement_.num_local(rank_), expert,
                   static_cast<float*>(out));
}

// The CPU's phases of moe/moe_block.h, on host rows.
struct MoeLayer::CpuOps {
  const MoeLayer& m;
  const float* x;
  int64_t T;
  int H;
  const uint64_t* gids;
  float* y;
  const LayerRouting& io;
  int E, K;
  std::vector<float> logits;  // [T, E]
  Routing r;
  std::vector<int32_t> physical;
  std::optional<CpuExpertRunner> runner;
  std::vector<float> shared, gate;

  bool replaying() const { return io.replay != nullptr; }
  void replayed_route() {  // the given choice instead of the router's (checked: ids of this model, T x K)
    StageScope stage(Stage::Router);
    const Routing& p = *io.replay;
    if (p.T != T || p.K != K || p.ids.size() != size_t(T * K) || p.weights.size() != size_t(T * K))
      throw InputError("routing replay: " + std::to_string(p.T) + " tokens x " + std::to_string(p.K) +
                       " experts given for a layer of " + std::to_string(T) + " x " + std::to_string(K));
    for (int32_t e : p.ids)
      if (e < 0 || e >= E)
        throw InputError("routing replay: expert id " + std::to_string(e) + " is outside 0.." + std::to_string(E - 1));
    r = p;
    choose_replicas();
  }
  void router_logits() {
    StageScope stage(Stage::Router);
    logits.resize(static_cast<size_t>(T * E));
    matmul(x, T, m.w_.router, logits.data(), m.compute_);
  }
  void route() {
    StageScope stage(Stage::Router);
    r = epmoe::route(m.routing_, logits.data(), T, m.w_.correction_bias.empty() ? nullptr : m.w_.correction_bias.data());
    choose_replicas();
  }
  void choose_replicas() {
    if (io.capture) *io.capture = r;
    physical.resize(static_cast<size_t>(T * K));
    for (int64_t t = 0; t < T; t++)
      for (int k = 0; k < K; k++)
        physical[size_t(t * K + k)] = m.placement_.choose(r.ids[size_t(t * K + k)], gids[t], k);
  }
  MoeTokens tokens() const {
    MoeTokens tok;
    tok.device = Device::Cpu;
    tok.act = DType::F32;
    tok.T = T;
    tok.H = H;
    tok.K = K;
    tok.x = x;
    tok.physical = physical.data();
    tok.weights = r.weights.data();
    return tok;
  }
  ExpertRunner& experts() { return runner.emplace(m.w_, m.placement_, m.rank_, H, m.compute_); }
  float* routed() { return y; }
  bool has_shared_expert() const { return !m.w_.shared.empty() && T > 0; }
  void shared_expert() {
    StageScope stage(Stage::Dense);
    shared.resize(static_cast<size_t>(T * H));
    swiglu_forward(m.w_.shared, x, T, shared.data(), m.compute_);
    gate.assign(size_t(T), 1.0f);
    if (!m.w_.shared_gate.empty()) {
      matmul(x, T, m.w_.shared_gate, gate.data(), m.compute_);
      for (auto& g : gate) g = 1.0f / (1.0f + std::exp(-g));
    }
  }
  void output() {  // the backend wrote the routed sum into y already
    if (shared.empty()) return;
    StageScope stage(Stage::Dense);
    for (int64_t t = 0; t < T; t++)
      for (int h = 0; h < H; h++) y[t * H + h] += gate[size_t(t)] * shared[size_t(t * H + h)];
  }
};

void MoeLayer::forward(const float* x, int64_t T, int H, const uint64_t* gids, A2ABackend& backend, float* y,
                       const LayerRouting& io) const {
  CpuOps ops{*this, x, T, H, gids, y, io, routing_.num_experts, routing_.top_k, {}, {}, {}, {}, {}, {}};
  run_moe_block(ops, backend);
}

}  // namespace epmoe
