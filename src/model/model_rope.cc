#include "model/model_rope.h"

#include <utility>

namespace epmoe {

Rope model_rope(const ModelConfig& c) {
  std::vector<float> inv_freq;
  if (c.yarn.enabled) {
    inv_freq = yarn_inv_freq(c.rotary_dim, c.rope_theta, c.yarn.factor, c.yarn.original_max_position_embeddings,
                             c.yarn.beta_fast, c.yarn.beta_slow, c.yarn.truncate);
  } else {
    inv_freq = Rope(c.head_dim, c.rotary_dim, c.rope_theta).inv_freq;
  }
  return Rope(c.head_dim, c.rotary_dim, std::move(inv_freq), float(c.yarn.enabled ? c.yarn.attention_factor : 1.0),
              c.mla.enabled() && c.mla.rope_interleave);
}

}  // namespace epmoe
