// The CPU's MoE layer: its weights, and its phases of the one MoE block (moe/moe_block.h, which
// orders them; the GPU supplies its own phases in model/cuda/gpu_model.cu). Every family runs
// through it; a family shows up only as data: its routing strategy (RoutingConfig) and its
// shared-expert weights.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "ep/backend.h"
#include "io/hf_config.h"
#include "moe/experts.h"
#include "moe/routing.h"

namespace epmoe {

struct MoeLayerWeights {
  TensorView router;                     // [E, H]
  std::vector<float> correction_bias;    // [E] or empty
  std::map<int, SwigluWeights> experts;  // logical expert -> weights, only those this rank owns
  SwigluWeights shared;                  // empty when the family has none
  TensorView shared_gate;                // [1, H] (Qwen2-MoE) or empty
};

// Global id of a token, the input of the replica choice: the sequence's index in the input
// and the position in it. Independent of the rank the sequence runs on.
inline uint64_t token_gid(uint64_t sequence, uint64_t position) { return (sequence << 32) | position; }

// The routed experts of one layer on the CPU, as the backend runs them: the jobs of the physical
// experts `rank` owns, grouped by expert (ep/cpu_expert_jobs.h), each group through its SwiGLU.
class CpuExpertRunner final : public ExpertRunner {
 public:
  CpuExpertRunner(const MoeLayerWeights& w, const Placement& placement, int rank, int H, ComputeMode compute)
      : w_(w), placement_(placement), rank_(rank), H_(H), compute_(compute) {}
  Device device() const override { return Device::Cpu; }
  void run(const ExpertJobs& jobs, void* out) override;

 private:
  const MoeLayerWeights& w_;
  const Placement& placement_;
  int rank_, H_;
  ComputeMode compute_;  // the model's
};

// Routing replay (R3): what a layer's router chose for the T tokens of a call (capture), or the
// choice to use instead of the router's (replay): logical expert ids [T, K] in top-k order and
// their fp32 weights (the weights the combine multiplies by, renormalised and scaled as the family
// does). The replica serving a (token, slot) is still the placement's choice.
struct LayerRouting {
  Routing* capture = nullptr;
  const Routing* replay = nullptr;
};

class MoeLayer {
 public:
  MoeLayer(const RoutingConfig& routing, const MoeLayerWeights& w, const Placement& placement, int rank,
           ComputeMode compute)
      : routing_(routing), w_(w), placement_(placement), rank_(rank), compute_(compute) {}

  // y: [T, H] (overwritten). gids: [T] token global ids.
  void forward(const float* x, int64_t T, int H, const uint64_t* gids, A2ABackend& backend, float* y,
               const LayerRouting& io = {}) const;

 private:
  struct CpuOps;  // its phases of moe/moe_block.h (moe_layer.cc)
  const RoutingConfig& routing_;
  const MoeLayerWeights& w_;
  const Placement& placement_;
  int rank_;
  ComputeMode compute_;  // the model's, for every product of the layer
};

}  // namespace epmoe
