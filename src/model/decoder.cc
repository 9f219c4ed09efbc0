#include "model/decoder.h"

#include <algorithm>
#include <string>

#include "moe/moe_layer.h"
#include "util/error.h"

namespace epmoe {

DecoderStep plan_decoder_step(const ModelConfig& cfg, const std::vector<Sequence*>& seqs,
                              const std::vector<std::vector<int32_t>>& tokens, const std::vector<LogitRows>& wanted) {
  EPMOE_ASSERT(seqs.size() == tokens.size() && seqs.size() == wanted.size(),
               "forward: one token list and one row want per sequence");
  DecoderStep st;
  st.offsets.assign(1, 0);
  for (const auto& t : tokens) st.offsets.push_back(st.offsets.back() + int64_t(t.size()));
  const int64_t T = st.T(), V = cfg.vocab_size;
  st.ids.resize(size_t(T));
  st.positions.resize(size_t(T));
  st.gids.resize(size_t(T));
  st.logit_span.assign(seqs.size(), {0, 0});
  for (size_t s = 0; s < seqs.size(); s++) {
    const Sequence& seq = *seqs[s];
    const int64_t n = int64_t(tokens[s].size());
    for (int64_t i = 0; i < n; i++) {
      const int32_t id = tokens[s][size_t(i)];
      if (id < 0 || id >= V)
        throw InputError("token id " + std::to_string(id) + " is outside the vocabulary (0.." + std::to_string(V - 1) + ")");
      const int64_t pos = seq.len + i;
      if (pos >= cfg.max_position_embeddings)
        throw InputError("sequence " + std::to_string(seq.id) + " reaches position " + std::to_string(pos) +
                         ", beyond max_position_embeddings (" + std::to_string(cfg.max_position_embeddings) + ")");
      const size_t t = size_t(st.offsets[s] + i);
      st.ids[t] = id;
      st.positions[t] = pos;
      st.gids[t] = token_gid(seq.id, uint64_t(pos));
      st.max_context = std::max(st.max_context, pos + 1);
    }
    if (n == 0 || wanted[s] == LogitRows::None) continue;
    const int64_t first = wanted[s] == LogitRows::All ? st.offsets[s] : st.offsets[s + 1] - 1;
    st.logit_span[s] = {int64_t(st.logit_rows.size()), st.offsets[s + 1] - first};
    for (int64_t t = first; t < st.offsets[s + 1]; t++) st.logit_rows.push_back(int32_t(t));
  }
  return st;
}

}  // namespace epmoe
