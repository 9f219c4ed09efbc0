#include "model/generate.h"

#include <algorithm>

namespace epmoe {

std::vector<std::vector<int32_t>> generate_greedy(Model& model, A2ABackend& backend, MpiGroup& comm,
                                                  const std::vector<GenerateRequest>& mine, const GenerateParams& p,
                                                  const std::function<void(size_t, int32_t)>& on_token) {
  const int64_t V = model.config().vocab_size;
  std::vector<Sequence> seqs;
  for (auto& r : mine) seqs.push_back(model.new_sequence(r.id));
  std::vector<std::vector<int32_t>> out(mine.size());
  std::vector<bool> done(mine.size(), p.max_new_tokens <= 0);
  // Step 0 feeds the prompts (prefill); later steps feed the last chosen token.
  std::vector<std::vector<int32_t>> feed(mine.size());
  for (size_t i = 0; i < mine.size(); i++) feed[i] = mine[i].prompt;

  for (;;) {
    std::vector<Sequence*> active;
    std::vector<std::vector<int32_t>> tokens;
    std::vector<size_t> index;
    for (size_t i = 0; i < mine.size(); i++)
      if (!done[i] && !feed[i].empty()) {
        active.push_back(&seqs[i]);
        tokens.push_back(feed[i]);
        index.push_back(i);
      }
    // Lockstep: a rank without work still runs the step (T = 0) while any rank has work.
    if (!comm.any(!active.empty())) break;
    auto logits = model.forward(active, tokens, backend, /*all_logits=*/false, p.forward);
    for (size_t a = 0; a < active.size(); a++) {
      const size_t i = index[a];
      const int32_t next = argmax(logits[a].data(), V);
      out[i].push_back(next);
      if (on_token) on_token(i, next);
      feed[i] = {next};
      const bool stop = std::find(p.stop_ids.begin(), p.stop_ids.end(), next) != p.stop_ids.end();
      if (stop || int(out[i].size()) >= p.max_new_tokens) done[i] = true;
    }
  }
  return out;
}

}  // namespace epmoe
