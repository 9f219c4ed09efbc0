#include "check/differential.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/lockstep.h"

namespace epmoe {

std::vector<float> log_softmax_rows(const std::vector<float>& logits, int64_t V) {
  std::vector<float> out(logits.size());
  const int64_t n = int64_t(logits.size()) / V;
  for (int64_t r = 0; r < n; r++) {
    const float* l = &logits[size_t(r * V)];
    const float m = *std::max_element(l, l + V);
    double s = 0;
    for (int64_t i = 0; i < V; i++) s += std::exp(double(l[i]) - m);
    const double lse = m + std::log(s);
    for (int64_t i = 0; i < V; i++) out[size_t(r * V + i)] = float(double(l[i]) - lse);
  }
  return out;
}

bool is_degenerate_tail(const std::vector<int32_t>& t) {
  const size_t n = t.size();
  if (n >= 4 && std::all_of(t.end() - 4, t.end(), [&](int32_t v) { return v == t.back(); })) return true;
  if (n >= 6) {
    bool alt = true;
    for (size_t i = n - 6; i + 2 < n; i++) alt &= t[i] == t[i + 2];
    if (alt) return true;
  }
  return false;
}

namespace {

// This rank's share: its logits (teacher-forced on the reference tokens) and, when generation was
// run, its greedy tokens, against the reference.
struct ComparisonTally {
  double max_abs = 0, sum_abs = 0;
  int64_t count = 0;
  bool identical = true;
  int64_t greedy_agree = 0, greedy_total = 0;
  bool degenerate = false;
};

}  // namespace

std::vector<std::vector<int32_t>> full_sequences(const ReferenceRun& r) {
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < r.prompts.size(); i++) {
    out.push_back(r.prompts[i]);
    out.back().insert(out.back().end(), r.generated[i].begin(), r.generated[i].end());
  }
  return out;
}

ReferenceRun run_reference(LanguageModel& model, A2ABackend& backend, Group& group, const std::vector<uint64_t>& ids,
                           const std::vector<std::vector<int32_t>>& prompts, int gen_tokens, const ForwardOptions& fo) {
  ReferenceRun r;
  r.ids = ids;
  r.prompts = prompts;
  std::vector<GenerateRequest> req;
  for (size_t i = 0; i < ids.size(); i++) req.push_back(GenerateRequest{ids[i], prompts[i], 0, 1, {}});
  GenerateParams gp;
  gp.max_new_tokens = gen_tokens;
  gp.forward = fo;
  r.generated = generate_greedy(model, backend, group, req, gp);
  const int64_t V = model.config().vocab_size;
  r.logits = score_sequences(model, backend, ids, full_sequences(r), fo);
  for (auto& l : r.logits) r.logprobs.push_back(log_softmax_rows(l, V));
  return r;
}

namespace {

ComparisonTally tally_comparison(const ReferenceRun& ref, const std::vector<std::vector<float>>& logits,
                                 const std::vector<std::vector<int32_t>>& gen, int64_t V) {
  ComparisonTally t;
  for (size_t i = 0; i < logits.size(); i++) {
    const bool same_shape = i < ref.logits.size() && logits[i].size() == ref.logits[i].size();
    t.identical &= same_shape && std::memcmp(logits[i].data(), ref.logits[i].data(), logits[i].size() * sizeof(float)) == 0;
    if (!same_shape) {
      t.max_abs = 1e30;
      continue;
    }
    auto lp = log_softmax_rows(logits[i], V);
    for (size_t j = 0; j < lp.size(); j++) {
      double d = std::fabs(double(lp[j]) - double(ref.logprobs[i][j]));
      if (!std::isfinite(d)) d = 1e30;
      t.max_abs = std::max(t.max_abs, d);
      t.sum_abs += d;
      t.count++;
    }
  }
  t.identical &= logits.size() == ref.logits.size();
  for (size_t i = 0; i < gen.size() && i < ref.generated.size(); i++) {
    size_t k = 0;
    while (k < gen[i].size() && k < ref.generated[i].size() && gen[i][k] == ref.generated[i][k]) k++;
    t.greedy_agree += int64_t(k);
    t.greedy_total += int64_t(ref.generated[i].size());
    t.degenerate |= is_degenerate_tail(gen[i]) && !is_degenerate_tail(ref.generated[i]);
  }
  return t;
}

// The stats over all ranks from each rank's tally (collective).
BackendStats comparison_stats(const ComparisonTally& t, Group& group) {
  BackendStats st;
  st.max_abs_dlogprob = group.allreduce_max_f64(t.max_abs);
  const int64_t n_all = group.allreduce_sum(t.count);
  st.mean_abs_dlogprob = group.allreduce_sum_f64(t.sum_abs) / double(std::max<int64_t>(1, n_all));
  st.identical = group.allreduce_sum(t.identical ? 0 : 1) == 0;
  st.greedy_agree = group.allreduce_sum(t.greedy_agree);
  st.greedy_total = group.allreduce_sum(t.greedy_total);
  st.degenerate = group.allreduce_sum(t.degenerate ? 1 : 0) > 0;
  return st;
}

}  // namespace

BackendStats compare_backend(LanguageModel& model, A2ABackend& backend, Group& group, const ReferenceRun& ref,
                             int gen_tokens, const ForwardOptions& fo) {
  const int64_t V = model.config().vocab_size;
  auto logits = score_sequences(model, backend, ref.ids, full_sequences(ref), fo);
  std::vector<std::vector<int32_t>> gen;
  if (gen_tokens > 0) {
    std::vector<GenerateRequest> req;
    for (size_t i = 0; i < ref.ids.size(); i++) req.push_back(GenerateRequest{ref.ids[i], ref.prompts[i], 0, 1, {}});
    GenerateParams gp;
    gp.max_new_tokens = gen_tokens;
    gp.forward = fo;
    gen = generate_greedy(model, backend, group, req, gp);
  }
  return comparison_stats(tally_comparison(ref, logits, gen, V), group);
}

}  // namespace epmoe
