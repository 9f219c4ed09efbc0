#include "model/language_model.h"

#include <algorithm>
#include <fstream>
#include <string>

#include <unistd.h>

#include "util/error.h"

namespace epmoe {

int64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return int64_t(sysconf(_SC_AVPHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
}

int64_t kv_pool_tokens(const KvOptions& opt, Device device, int64_t free_bytes, int64_t bytes_per_token) {
  const int64_t B = opt.block_tokens;
  int64_t tokens = opt.tokens;
  if (tokens <= 0) {
    const double share = device == Device::Cuda ? 0.40 : 0.25;
    tokens = std::min<int64_t>(int64_t(double(free_bytes) * share) / std::max<int64_t>(1, bytes_per_token), 1 << 20);
    tokens = std::max<int64_t>(tokens, B);
  }
  return (tokens + B - 1) / B * B;
}

void append_step_tokens(KvPool& pool, const std::vector<Sequence*>& seqs,
                        const std::vector<std::vector<int32_t>>& tokens) {
  for (size_t s = 0; s < seqs.size(); s++) {
    Sequence& seq = *seqs[s];
    EPMOE_ASSERT(seq.kv && &seq.kv->pool() == &pool,
                 "sequence " + std::to_string(seq.id) + ": its KV cache is not this model's");
    EPMOE_ASSERT(seq.kv->tokens() == seq.len, "sequence " + std::to_string(seq.id) + ": KV cache holds " +
                                                  std::to_string(seq.kv->tokens()) + " tokens, the sequence " +
                                                  std::to_string(seq.len));
    pool.append(*seq.kv, tokens[s].data(), int64_t(tokens[s].size()));
  }
}

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

std::vector<Drawn> LanguageModel::forward_draw(const std::vector<Sequence*>&, const std::vector<std::vector<int32_t>>&,
                                               A2ABackend&, const std::vector<DrawRequest>&, const ForwardOptions&) {
  throw Error("forward_draw: the " + std::string(device_name(device())) + " model draws on the host");
}

}  // namespace epmoe
