#include "model/language_model.h"

namespace epmoe {

int32_t argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

std::vector<int32_t> LanguageModel::forward_greedy(const std::vector<Sequence*>& seqs,
                                                   const std::vector<std::vector<int32_t>>& tokens,
                                                   A2ABackend& backend, const ForwardOptions& opt) {
  const auto logits = forward(seqs, tokens, backend, /*all_logits=*/false, opt);
  std::vector<int32_t> next(seqs.size(), -1);
  for (size_t i = 0; i < seqs.size(); i++)
    if (!logits[i].empty()) next[i] = argmax(logits[i].data(), config().vocab_size);
  return next;
}

}  // namespace epmoe
