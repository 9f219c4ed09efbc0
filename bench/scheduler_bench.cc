// The scheduler's cost against the fixed-batch forward it drives, and tokens/s at 1, 8, 64 and
// 256 concurrent sequences (issue 15). For each batch B, in one run:
//   fixed:     B sequences, one forward with all prompts, then decode steps of the bare forward:
//              model.forward() with the next token an argmax outside the timing (CPU), or
//              forward_greedy() with the argmax on the device (GPU, where the scheduler's tokens
//              are drawn on the device too) -- so the overhead below includes sampling;
//   scheduler: the same B prompts as requests through engine/scheduler.h (admission against the
//              KV pool, block tables, sampling at temperature 0.8 with each token's log-prob),
//              each step timed whole.
// The overhead is median(scheduler decode step) / median(fixed decode step) - 1, and, from the
// scheduler's own clock, the share of its decode steps spent outside the forward (scheduling and
// sampling; paging runs inside the forward on both sides). Figures are printed, never asserted.
//
//   scheduler_bench --model DIR [--compute f32|bf16]                 CPU, a checkpoint
//                                                                    (epmoe synth --like qwen3-30b-a3b --layers 4)
//   scheduler_bench --device cuda [--layers 4]                       one GPU, the synthesized model on the device
//   common: [--batches 1,8,64,256] [--prompt 32] [--steps 8] [--repeat 2]: each figure the best of
//           --repeat interleaved runs, the two sides taking turns to run first
//   EPMOE_BENCH_ONLY=fixed|sched: one side alone (for a profiler); EPMOE_BENCH_GREEDY=1: the
//   scheduler decodes greedily without log-probs (what sampling costs, by difference)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/mpi_group.h"
#include "engine/scheduler.h"
#include "ep/backend.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/model_presets.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "util/error.h"
#include "util/threads.h"
#ifdef EPMOE_HAVE_CUDA
#include "comm/nccl_group.h"
#include "model/cuda/gpu_model.h"
#endif

using namespace epmoe;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  for (size_t p = 0; p < s.size();) {
    const size_t q = s.find(',', p);
    out.push_back(std::stoi(s.substr(p, q - p)));
    p = q == std::string::npos ? s.size() : q + 1;
  }
  return out;
}

struct Row {
  int batch = 0;
  double fixed_prefill_s = 0, sched_prefill_s = 0;
  double fixed_step_ms = 0, sched_step_ms = 0, outside_forward = 0;
};

const char* g_only = nullptr;  // EPMOE_BENCH_ONLY=fixed|sched: one side alone (for profiling)

Row measure(LanguageModel& m, A2ABackend& be, Group& g, int B, int P, int steps, uint64_t seed) {
  const int64_t V = m.config().vocab_size;
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B));
  for (auto& p : prompts) {
    p.resize(size_t(P));
    for (auto& t : p) t = int32_t(rng() % uint64_t(V));
  }
  Row r;
  r.batch = B;
  auto fixed = [&] {  // B sequences driven by hand
    std::vector<Sequence> seqs;
    for (int b = 0; b < B; b++) seqs.push_back(m.new_sequence(uint64_t(b)));
    std::vector<Sequence*> ptrs;
    for (auto& s : seqs) ptrs.push_back(&s);
    double t0 = now();
    std::vector<std::vector<float>> logits;
    std::vector<std::vector<int32_t>> next;
    if (m.draws_on_device()) {
      for (int32_t id : m.forward_greedy(ptrs, prompts, be)) next.push_back({id});
      r.fixed_prefill_s = now() - t0;
    } else {
      logits = m.forward(ptrs, prompts, be, false);
      r.fixed_prefill_s = now() - t0;
      for (auto& l : logits) next.push_back({argmax(l.data(), V)});
    }
    std::vector<double> t;
    for (int i = 0; i < steps; i++) {
      t0 = now();
      if (m.draws_on_device()) {
        const std::vector<int32_t> picked = m.forward_greedy(ptrs, next, be);
        for (size_t b = 0; b < next.size(); b++) next[b] = {picked[b]};
        t.push_back(now() - t0);
      } else {
        logits = m.forward(ptrs, next, be, false);
        t.push_back(now() - t0);
        for (size_t b = 0; b < next.size(); b++) next[b] = {argmax(logits[b].data(), V)};
      }
    }
    r.fixed_step_ms = median(t) * 1e3;
  };
  auto scheduled = [&] {  // the same prompts through the scheduler
    // The same prompts ran in the fixed batch: without the prefix cache the scheduler computes
    // them in full too.
    m.kv_pool().flush_prefix_cache();
    SchedulerOptions so;
    so.prefix_cache = false;
    Scheduler s(m, be, g, so);
    // EPMOE_BENCH_GREEDY=1: greedy without log-probs (no sampling work between the forwards).
    const bool greedy = std::getenv("EPMOE_BENCH_GREEDY") != nullptr;
    for (int b = 0; b < B; b++) {
      GenerateRequest q;
      q.id = uint64_t(b);
      q.prompt = prompts[size_t(b)];
      q.seed = seed + uint64_t(b);
      q.params.max_new_tokens = steps + 1;
      q.params.sampling.temperature = greedy ? 0.0f : 0.8f;
      q.params.logprobs = !greedy;
      s.submit(std::move(q));
    }
    std::vector<double> t;
    double outside = 0, whole = 0;
    for (;;) {
      const SchedulerStats before = s.stats();
      const double t0 = now();
      if (!s.step()) break;
      const double dt = now() - t0;
      const SchedulerStats& after = s.stats();
      if (after.prefill_tokens > before.prefill_tokens) {
        r.sched_prefill_s += dt;
        continue;
      }
      t.push_back(dt);
      whole += after.step_seconds - before.step_seconds;
      outside += (after.step_seconds - before.step_seconds) - (after.forward_seconds - before.forward_seconds);
    }
    r.sched_step_ms = median(t) * 1e3;
    r.outside_forward = whole > 0 ? outside / whole : 0;
  };
  // The side that runs second in a process meets a used pool and heap; alternate which it is.
  const bool fixed_first = (seed & 1) == 0;
  if (fixed_first && (!g_only || std::string(g_only) == "fixed")) fixed();
  if (!g_only || std::string(g_only) == "sched") scheduled();
  if (!fixed_first && (!g_only || std::string(g_only) == "fixed")) fixed();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string model_dir, device = "cpu", compute;
    std::vector<int> batches = {1, 8, 64, 256};
    int prompt = 32, steps = 8, layers = 4, repeat = 2;
    (void)layers;  // read by the GPU branch
    for (int i = 1; i < argc; i++) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw InputError(a + " needs a value");
        return argv[++i];
      };
      if (a == "--model") model_dir = next();
      else if (a == "--device") device = next();
      else if (a == "--compute") compute = next();
      else if (a == "--batches") batches = parse_list(next());
      else if (a == "--prompt") prompt = std::stoi(next());
      else if (a == "--steps") steps = std::stoi(next());
      else if (a == "--layers") layers = std::stoi(next());
      else if (a == "--repeat") repeat = std::max(1, std::stoi(next()));
      else throw InputError("unknown argument " + a + " (see the comment at the top of bench/scheduler_bench.cc)");
    }
    g_only = std::getenv("EPMOE_BENCH_ONLY");
    std::unique_ptr<LanguageModel> model;
    std::unique_ptr<A2ABackend> backend;
    std::unique_ptr<Checkpoint> ckpt;
    Group* group = nullptr;
    std::string what;
    if (device == "cpu") {
      if (model_dir.empty()) throw InputError("--model DIR (epmoe synth --like qwen3-30b-a3b --layers 4 --out DIR)");
      group = &MpiGroup::world();
      const ModelConfig cfg = load_model_config(model_dir);
      ckpt = std::make_unique<Checkpoint>(model_dir);
      const Placement pl = Placement::make_default(cfg.routing.num_experts, 1, 0);
      const ComputeMode mode = compute == "bf16" ? ComputeMode::BF16 : ComputeMode::F32;
      model = std::make_unique<Model>(cfg, *ckpt, pl, 0, mode);
      backend = make_local_backend(Device::Cpu, pl);
      what = "cpu, " + std::to_string(num_threads()) + " threads, compute " + (compute.empty() ? "f32" : compute) +
             ", " + model_dir;
    } else if (device == "cuda") {
#ifdef EPMOE_HAVE_CUDA
      group = &NcclGroup::world();
      nlohmann::json j = *model_preset("qwen3-30b-a3b");
      j["num_hidden_layers"] = layers;
      const ModelConfig cfg = parse_model_config(j, "synthesized Qwen3-30B-A3B (" + std::to_string(layers) + " layers)");
      const Placement pl = Placement::make_default(cfg.routing.num_experts, 1, 0);
      model = make_synthetic_gpu_model(cfg, pl, 0, compute == "f32", 42);
      backend = make_local_backend(Device::Cuda, pl);
      what = "one GPU, compute " + (compute.empty() ? std::string("bf16") : compute) + ", synthesized Qwen3-30B-A3B " +
             std::to_string(layers) + " layers";
#else
      throw InputError("--device cuda: this build has no CUDA (configure with -DEPMOE_CUDA=ON)");
#endif
    } else {
      throw InputError("--device " + device + ": cpu or cuda");
    }
    std::printf("scheduler_bench: %s; prompts of %d tokens, %d decode steps, best of %d; sampling T=0.8 with "
                "log-probs\n", what.c_str(), prompt, steps, repeat);
    // Warm-up: page the weights in (CPU) and let the GPU allocate its workspaces.
    measure(*model, *backend, *group, 8, 8, 2, 1);
    std::printf("| sequences | prefill tok/s fixed | prefill tok/s sched | decode tok/s fixed | decode tok/s sched | "
                "decode step ms fixed | sched | overhead | outside forward |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int B : batches) {
      Row r = measure(*model, *backend, *group, B, prompt, steps, 8);
      for (int k = 1; k < repeat; k++) {
        const Row o = measure(*model, *backend, *group, B, prompt, steps, 8 + uint64_t(k));
        r.fixed_prefill_s = std::min(r.fixed_prefill_s, o.fixed_prefill_s);
        r.sched_prefill_s = std::min(r.sched_prefill_s, o.sched_prefill_s);
        r.fixed_step_ms = std::min(r.fixed_step_ms, o.fixed_step_ms);
        if (o.sched_step_ms < r.sched_step_ms) {
          r.sched_step_ms = o.sched_step_ms;
          r.outside_forward = o.outside_forward;
        }
      }
      std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %+.1f%% | %.1f%% |\n", B,
                  double(B) * prompt / r.fixed_prefill_s, double(B) * prompt / r.sched_prefill_s,
                  B / (r.fixed_step_ms * 1e-3), B / (r.sched_step_ms * 1e-3), r.fixed_step_ms, r.sched_step_ms,
                  (r.sched_step_ms / r.fixed_step_ms - 1) * 100, r.outside_forward * 100);
      std::fflush(stdout);
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "scheduler_bench: %s\n", e.what());
    return e.exit_code();
  }
}
