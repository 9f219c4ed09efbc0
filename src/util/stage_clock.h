// Wall time of a forward pass by stage (attention, q/k/v/o, norms, router, experts, combine,
// lm_head, ...), for bench/model_bench --stages: where a step's time goes, measured in the run
// that reports the throughput. Off by default; a scope then costs one relaxed load.
//
// Stages are exclusive: a scope opened inside another pauses the outer one, so the figures add up
// to the step's wall time (what no stage claims shows up as the benchmark's "other"). Only the
// thread that drives the step records (the pool's workers run inside the stages' parallel_for).
#pragma once

#include <array>

namespace epmoe {

enum class Stage : int {
  Embed,      // token embedding rows
  Norm,       // RMSNorms (input, post-attention, final)
  Qkv,        // q/k/v projections, biases, q/k norms
  Rope,       // rotary embedding and the KV cache write
  Attention,  // scores, softmax, context over the cache
  OProj,      // attention output projection
  Residual,   // residual adds
  Router,     // router logits, top-k, expert choice
  Experts,    // the expert GEMMs (with gathering their rows)
  Combine,    // weighted sum of the expert outputs
  Dense,      // dense MLP layers and shared experts
  LmHead,     // final norm excluded: the vocabulary projection
  Count
};
inline constexpr int kStages = int(Stage::Count);
const char* stage_name(Stage s);

void stage_clock_enable(bool on);
void stage_clock_reset();
std::array<double, kStages> stage_clock_seconds();  // since the last reset

class StageScope {
 public:
  explicit StageScope(Stage s);
  ~StageScope();
  StageScope(const StageScope&) = delete;
  StageScope& operator=(const StageScope&) = delete;

 private:
  bool on_;
  int prev_;
};

}  // namespace epmoe
