#include "moe/moe_layer.h"

#include <cmath>
#include <optional>

#include "ep/cpu_expert_jobs.h"
#include "kernels/matmul.h"
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

void MoeLayer::forward(const float* x, int64_t T, int H, const uint64_t* gids, A2ABackend& backend, float* y,
                       const LayerRouting& io) const {
  const int E = routing_.num_experts, K = routing_.top_k;
  std::optional<StageScope> router(std::in_place, Stage::Router);
  Routing r;
  if (io.replay) {  // the given choice instead of the router's (checked: ids of this model, T x K)
    const Routing& p = *io.replay;
    if (p.T != T || p.K != K || p.ids.size() != size_t(T * K) || p.weights.size() != size_t(T * K))
      throw InputError("routing replay: " + std::to_string(p.T) + " tokens x " + std::to_string(p.K) +
                       " experts given for a layer of " + std::to_string(T) + " x " + std::to_string(K));
    for (int32_t e : p.ids)
      if (e < 0 || e >= E)
        throw InputError("routing replay: expert id " + std::to_string(e) + " is outside 0.." + std::to_string(E - 1));
    r = p;
  } else {
    std::vector<float> logits(static_cast<size_t>(T * E));
    matmul(x, T, w_.router, logits.data(), compute_);
    r = route(routing_, logits.data(), T, w_.correction_bias.empty() ? nullptr : w_.correction_bias.data());
  }
  if (io.capture) *io.capture = r;

  std::vector<int32_t> physical(static_cast<size_t>(T * K));
  for (int64_t t = 0; t < T; t++)
    for (int k = 0; k < K; k++)
      physical[size_t(t * K + k)] = placement_.choose(r.ids[size_t(t * K + k)], gids[t], k);

  MoeTokens tok;
  tok.device = Device::Cpu;
  tok.act = DType::F32;
  tok.T = T;
  tok.H = H;
  tok.K = K;
  tok.x = x;
  tok.physical = physical.data();
  tok.weights = r.weights.data();
  CpuExpertRunner experts(w_, placement_, rank_, H, compute_);
  router.reset();
  backend.run(tok, experts, y);

  if (!w_.shared.empty() && T > 0) {
    StageScope shared(Stage::Dense);
    std::vector<float> s(static_cast<size_t>(T * H));
    swiglu_forward(w_.shared, x, T, s.data(), compute_);
    std::vector<float> gate(size_t(T), 1.0f);
    if (!w_.shared_gate.empty()) {
      matmul(x, T, w_.shared_gate, gate.data(), compute_);
      for (auto& g : gate) g = 1.0f / (1.0f + std::exp(-g));
    }
    for (int64_t t = 0; t < T; t++)
      for (int h = 0; h < H; h++) y[t * H + h] += gate[size_t(t)] * s[size_t(t * H + h)];
  }
}

}  // namespace epmoe
