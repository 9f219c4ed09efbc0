#include "model/language_model.h"

#include <algorithm>
#include <cstdio>
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

KvDtype parse_kv_dtype(const std::string& s) {
  if (s == "auto") return KvDtype::Auto;
  if (s == "fp32" || s == "f32" || s == "float32") return KvDtype::F32;
  if (s == "bf16" || s == "bfloat16") return KvDtype::BF16;
  throw InputError("--kv-cache-dtype '" + s + "': expected auto, bf16 or fp32");
}

const char* kv_dtype_name(KvDtype d) {
  switch (d) {
    case KvDtype::Auto: return "auto";
    case KvDtype::F32: return "fp32";
    case KvDtype::BF16: return "bf16";
  }
  return "?";
}

int64_t kv_pool_tokens(const KvOptions& opt, Device device, int64_t free_bytes, int64_t bytes_per_token,
                       int64_t total_bytes) {
  const int64_t B = opt.block_tokens;
  const int64_t per_token = std::max<int64_t>(1, bytes_per_token);
  int64_t tokens = opt.tokens;
  if (tokens <= 0) {
    int64_t budget = 0;
    switch (device) {
      case Device::Cpu: budget = int64_t(double(free_bytes) * 0.25); break;
      case Device::Cuda: {
        const double f = opt.mem_fraction > 0 ? opt.mem_fraction : kDefaultGpuMemFraction;
        if (!(f > 0 && f <= 1)) throw InputError("--mem-fraction " + std::to_string(f) + ": expected a share in (0, 1]");
        budget = free_bytes - int64_t((1.0 - f) * double(total_bytes));
        if (budget < B * per_token) {
          char msg[400];
          std::snprintf(msg, sizeof msg,
                        "--mem-fraction %.2f: %.1f GiB of the GPU's %.1f GiB are free after the weights and %.1f GiB "
                        "must stay free for activations: no room for one KV block (%lld bytes); raise --mem-fraction "
                        "or give --kv-cache-tokens",
                        f, double(free_bytes) / double(1 << 30), double(total_bytes) / double(1 << 30),
                        (1.0 - f) * double(total_bytes) / double(1 << 30), (long long)(B * per_token));
          throw InputError(msg);
        }
        break;
      }
    }
    tokens = std::min<int64_t>(budget / per_token, 1 << 20);
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

namespace {
StepBatch batch_of(const std::vector<Sequence*>& seqs, const std::vector<std::vector<int32_t>>& tokens,
                   StepWant want, const ForwardOptions& opt) {
  EPMOE_ASSERT(seqs.size() == tokens.size(), "forward: one token list per sequence");
  return StepBatch{seqs, tokens, std::vector<StepWant>(seqs.size(), want), {}, opt};
}
}  // namespace

std::vector<std::vector<float>> LanguageModel::forward(const std::vector<Sequence*>& seqs,
                                                       const std::vector<std::vector<int32_t>>& tokens,
                                                       A2ABackend& backend, bool all_logits, const ForwardOptions& opt) {
  return step(batch_of(seqs, tokens, all_logits ? StepWant::AllLogits : StepWant::Logits, opt), backend).logits;
}

std::vector<int32_t> LanguageModel::forward_greedy(const std::vector<Sequence*>& seqs,
                                                   const std::vector<std::vector<int32_t>>& tokens,
                                                   A2ABackend& backend, const ForwardOptions& opt) {
  return step(batch_of(seqs, tokens, StepWant::Argmax, opt), backend).argmax;
}

std::vector<Drawn> LanguageModel::forward_draw(const std::vector<Sequence*>& seqs,
                                               const std::vector<std::vector<int32_t>>& tokens, A2ABackend& backend,
                                               const std::vector<DrawRequest>& draws, const ForwardOptions& opt) {
  StepBatch b = batch_of(seqs, tokens, StepWant::Nothing, opt);
  for (const DrawRequest& d : draws) {
    EPMOE_ASSERT(d.row >= 0 && size_t(d.row) < seqs.size() && !tokens[size_t(d.row)].empty(),
                 "forward_draw: row " + std::to_string(d.row) + " has no new token in this step");
    b.want[size_t(d.row)] = StepWant::Draw;
  }
  b.draws = draws;
  return step(b, backend).drawn;
}

// The rows of each sequence a step computes logits for: none, its last, or all its new ones.
std::vector<LogitRows> logit_rows_of(const StepBatch& b) {
  std::vector<LogitRows> out(b.want.size(), LogitRows::None);
  for (size_t i = 0; i < b.want.size(); i++) {
    switch (b.want[i]) {
      case StepWant::Nothing: break;
      case StepWant::AllLogits: out[i] = LogitRows::All; break;
      case StepWant::Logits:
      case StepWant::Argmax:
      case StepWant::Draw: out[i] = LogitRows::Last; break;
    }
  }
  return out;
}

}  // namespace epmoe
