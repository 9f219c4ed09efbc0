#include "util/stage_clock.h"

#include <atomic>
#include <chrono>

namespace epmoe {

namespace {

std::atomic<bool> g_on{false};
std::array<double, kStages> g_seconds{};
thread_local int t_stage = -1;  // the open stage on this thread
thread_local double t_since = 0;  // when it (re)started

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::Embed: return "embed";
    case Stage::Norm: return "norms";
    case Stage::Qkv: return "q/k/v";
    case Stage::Rope: return "rope + KV write";
    case Stage::Attention: return "attention";
    case Stage::OProj: return "o_proj";
    case Stage::Residual: return "residual";
    case Stage::Router: return "router + top-k";
    case Stage::Experts: return "experts";
    case Stage::Combine: return "combine";
    case Stage::Dense: return "dense MLP / shared";
    case Stage::LmHead: return "lm_head";
    case Stage::Count: break;
  }
  return "?";
}

void stage_clock_enable(bool on) { g_on.store(on, std::memory_order_relaxed); }
void stage_clock_reset() { g_seconds.fill(0); }
std::array<double, kStages> stage_clock_seconds() { return g_seconds; }

StageScope::StageScope(Stage s) : on_(g_on.load(std::memory_order_relaxed)), prev_(-1) {
  if (!on_) return;
  const double t = now();
  prev_ = t_stage;
  if (prev_ >= 0) g_seconds[size_t(prev_)] += t - t_since;  // pause the enclosing stage
  t_stage = int(s);
  t_since = t;
}

StageScope::~StageScope() {
  if (!on_) return;
  const double t = now();
  g_seconds[size_t(t_stage)] += t - t_since;
  t_stage = prev_;
  t_since = t;
}

}  // namespace epmoe
