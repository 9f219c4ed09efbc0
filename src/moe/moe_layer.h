// The one MoE layer of the code base. Every family runs through it; a family shows up only as
// data: its routing strategy (RoutingConfig) and its shared-expert weights.
//
//   x[T, H] -> router logits -> route() -> placement (replica per token, slot)
//           -> backend.run()  (dispatch, experts, combine: FINAL, reduced once)
//           -> + shared expert(s) on the home rank
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

class MoeLayer {
 public:
  MoeLayer(const RoutingConfig& routing, const MoeLayerWeights& w, const Placement& placement)
      : routing_(routing), w_(w), placement_(placement) {}

  // y: [T, H] (overwritten). gids: [T] token global ids.
  void forward(const float* x, int64_t T, int H, const uint64_t* gids, A2ABackend& backend, float* y) const;

  // The callable the backend runs for a physical expert this rank owns.
  ExpertFn expert_fn() const;

 private:
  const RoutingConfig& routing_;
  const MoeLayerWeights& w_;
  const Placement& placement_;
};

}  // namespace epmoe
