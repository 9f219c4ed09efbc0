// The whole model on the CPU, as a user runs it: prefill (512 and 2048 tokens by default) and
// decode (64 greedy steps after a 512-token prompt), fp32 and bf16 compute, tokens/s -- each
// figure with the read bandwidth measured right before it (decode is memory-bound and this kind
// of VM moves between bandwidth levels from one minute to the next), and, with --llama-bench,
// llama.cpp's llama-bench on the same weights (a GGUF of the same checkpoint) interleaved in the
// same run, so that the ratios can be read from one run. --stages adds where each step's time
// goes (util/stage_clock.h). Figures are printed, never asserted.
//
//   model_bench --model synth4 [--llama-bench /tmp/llama.cpp/build/bin/llama-bench --gguf synth4-bf16.gguf]
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ep/backend.h"
#include "io/checkpoint.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "util/reserved_memory.h"
#include "util/stage_clock.h"
#include "util/threads.h"

using namespace epmoe;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Read bandwidth now: the sum of 1 GiB of uint64 on the pool's threads, best of 5 passes (what
// ../shared/anchors/llamacpp/bw_probe.c measures, so the two can be compared).
class BandwidthProbe {
 public:
  BandwidthProbe() : a_(size_t(1) << 27) {
    parallel_for(int64_t(a_.size() / 4096), 16, [&](int64_t b, int64_t e) {
      for (size_t i = size_t(b) * 4096; i < size_t(e) * 4096; i++) a_[i] = i & 1023;
    });
  }
  double gbs() {
    double best = 1e9;
    for (int pass = 0; pass < 5; pass++) {
      std::vector<uint64_t> part(64, 0);
      const double t0 = now();
      parallel_for(int64_t(a_.size() / 4096), 1024, [&](int64_t b, int64_t e) {
        uint64_t s = 0;
        for (size_t i = size_t(b) * 4096; i < size_t(e) * 4096; i++) s += a_[i];
        part[size_t(b * 63 / int64_t(a_.size() / 4096))] += s;
      });
      best = std::min(best, now() - t0);
      sink_ += part[0];
    }
    return double(a_.size() * sizeof(uint64_t)) / best / 1e9;
  }

 private:
  std::vector<uint64_t> a_;
  uint64_t sink_ = 0;
};

struct Figure {
  std::string who;    // "llama.cpp bf16", "epmoe f32", ...
  std::string what;   // "prefill 512", "decode 64 @512"
  double tok_s = 0;
  double gbs = 0;     // read bandwidth right before
  std::array<double, kStages> stages{};  // seconds per step (epmoe, --stages)
  double step_s = 0;  // wall seconds per step (prefill: the whole prompt; decode: one token)
};

std::vector<int32_t> random_ids(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = int32_t(rng() % uint64_t(std::min(vocab, 151643)));  // below Qwen's special ids
  return ids;
}

struct Epmoe {
  std::string who;  // "epmoe f32", "epmoe bf16 int8-head", ...
  ComputeMode mode;
  std::unique_ptr<Model> model;
  std::unique_ptr<A2ABackend> backend;
};

Figure time_prefill(Epmoe& e, int n, uint64_t seed) {
  const std::vector<int32_t> prompt = random_ids(n, e.model->config().vocab_size, seed);
  Sequence s = e.model->new_sequence(0);
  stage_clock_reset();
  const double t0 = now();
  e.model->forward({&s}, {prompt}, *e.backend, false);
  Figure f;
  f.step_s = now() - t0;
  f.tok_s = n / f.step_s;
  f.stages = stage_clock_seconds();
  return f;
}

Figure time_decode(Epmoe& e, int steps, int depth, uint64_t seed) {
  const ModelConfig& cfg = e.model->config();
  Sequence s = e.model->new_sequence(0);
  auto l = e.model->forward({&s}, {random_ids(depth, cfg.vocab_size, seed)}, *e.backend, false);
  stage_clock_reset();
  const double t0 = now();
  for (int i = 0; i < steps; i++) {
    const int32_t next = int32_t(std::max_element(l[0].begin(), l[0].end()) - l[0].begin());
    l = e.model->forward({&s}, {{next}}, *e.backend, false);
  }
  Figure f;
  const double t = now() - t0;
  f.tok_s = steps / t;
  f.step_s = t / steps;
  f.stages = stage_clock_seconds();
  for (double& x : f.stages) x /= steps;
  return f;
}

// llama-bench's JSON: one object per test with n_prompt, n_gen, n_depth and avg_ts.
std::vector<Figure> run_llama(const std::string& bin, const std::string& gguf, const std::string& args, int threads) {
  const std::string cmd = bin + " -m " + gguf + " -t " + std::to_string(threads) + " -r 1 -o json " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("cannot run " + cmd);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int rc = pclose(p);
  const size_t a = out.find('['), b = out.rfind(']');
  if (rc != 0 || a == std::string::npos || b == std::string::npos)
    throw std::runtime_error("llama-bench failed (exit " + std::to_string(rc) + "): " + cmd);
  std::vector<Figure> figs;
  for (const auto& t : nlohmann::json::parse(out.substr(a, b - a + 1))) {
    Figure f;
    f.who = "llama.cpp";
    const int np = t.at("n_prompt").get<int>(), ng = t.at("n_gen").get<int>(), nd = t.value("n_depth", 0);
    f.what = np > 0 ? "prefill " + std::to_string(np) : "decode " + std::to_string(ng) + " @" + std::to_string(nd);
    f.tok_s = t.at("avg_ts").get<double>();
    figs.push_back(f);
  }
  return figs;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Whole-model CPU throughput: prefill and decode tok/s, fp32 and bf16 compute, with the read bandwidth "
               "of the moment and (optionally) llama.cpp's llama-bench on the same weights in the same run"};
  std::string dir, llama, gguf, compute = "f32,bf16", heads = "checkpoint";
  std::vector<int> prefill{512, 2048};
  int decode = 64, depth = 512, cycles = 3, threads = 2;
  bool stages = false, decode_only = false;
  app.add_option("--model", dir, "checkpoint directory (e.g. from `epmoe synth --like qwen3-30b-a3b --layers 4`)")
      ->required();
  app.add_option("--compute", compute, "compute modes, comma-separated: f32, bf16")->capture_default_str();
  app.add_option("--lm-head", heads,
                 "lm_head forms, comma-separated: checkpoint (as stored), int8 (quantized at load: epmoe --lm-head int8)")
      ->capture_default_str();
  app.add_option("--prefill", prefill, "prompt lengths to time (tokens)")->delimiter(',')->capture_default_str();
  app.add_option("--decode", decode, "greedy decode steps to time")->capture_default_str();
  app.add_option("--depth", depth, "prompt length before the decode steps")->capture_default_str();
  app.add_option("--cycles", cycles, "interleaved cycles (each figure once per cycle; medians reported)")
      ->capture_default_str();
  app.add_option("--threads", threads, "threads, for epmoe and llama-bench alike")->capture_default_str();
  app.add_flag("--stages", stages, "also print where each step's time goes, by stage");
  app.add_flag("--decode-only", decode_only, "time decode only (no prefill rows; e.g. an fp8 checkpoint beside a Q8_0 GGUF)");
  app.add_option("--llama-bench", llama, "llama.cpp's llama-bench binary: run on --gguf in each cycle");
  app.add_option("--gguf", gguf, "the same weights as a GGUF (../shared/anchors/llamacpp/hf_to_gguf_bf16.py)");
  CLI11_PARSE(app, argc, argv);
  if (decode_only) prefill.clear();
  if (!llama.empty() && gguf.empty()) {
    std::fprintf(stderr, "--llama-bench needs --gguf\n");
    return 2;
  }

  keep_step_buffers_in_heap();  // as the epmoe CLI does (util/reserved_memory.h)
  set_num_threads(threads);
  stage_clock_enable(stages);
  std::vector<Epmoe> runs;
  const ModelConfig cfg = load_model_config(dir);
  Checkpoint ck(dir);
  const Placement placement = Placement::make_default(cfg.routing.num_experts, 1, 0);
  KvOptions kv;
  const int longest = prefill.empty() ? depth : std::max(depth, *std::max_element(prefill.begin(), prefill.end()));
  kv.tokens = std::max(depth + decode, longest) + 64;
  for (const std::string& m : {std::string("f32"), std::string("bf16")}) {
    if (compute.find(m) == std::string::npos) continue;
    const ComputeMode mode = m == "bf16" ? ComputeMode::BF16 : ComputeMode::F32;
    if (mode == ComputeMode::BF16 && !cpu_features().avx512_bf16) {
      std::printf("bf16 compute skipped: this CPU has no AVX512-BF16\n");
      continue;
    }
    for (const std::string& h : {std::string("checkpoint"), std::string("int8")}) {
      if (heads.find(h) == std::string::npos) continue;
      Epmoe e{"epmoe " + m + (h == "int8" ? " int8-head" : ""), mode,
              std::make_unique<Model>(cfg, ck, placement, 0, mode, kv, parse_lm_head_form(h)),
              make_local_backend(Device::Cpu, placement)};
      // Warm-up at the longest prompt: the first pass faults the mapped checkpoint in (every expert
      // a long prompt reaches) and grows the step buffers; the figures are the steady state.
      time_prefill(e, longest, 1);
      runs.push_back(std::move(e));
    }
  }
  std::printf("model %s: %d layers, hidden %d, %d experts top-%d; %d threads; %s\n", dir.c_str(), cfg.num_layers,
              cfg.hidden_size, cfg.routing.num_experts, cfg.routing.top_k, threads, kernel_description(ComputeMode::F32).c_str());
  if (!llama.empty()) std::printf("llama.cpp: %s on %s, the same threads\n", llama.c_str(), gguf.c_str());

  BandwidthProbe probe;
  std::vector<Figure> all;
  auto record = [&](Figure f) {
    std::printf("  %-16s %-16s %9.1f tok/s   (read %.1f GB/s before)\n", f.who.c_str(), f.what.c_str(), f.tok_s, f.gbs);
    std::fflush(stdout);
    all.push_back(f);
  };
  std::string plist;
  for (int n : prefill) plist += (plist.empty() ? "" : ",") + std::to_string(n);
  for (int c = 0; c < cycles; c++) {
    std::printf("cycle %d of %d\n", c + 1, cycles);
    if (!llama.empty()) {
      double bw;
      if (!prefill.empty()) {
        bw = probe.gbs();
        for (Figure f : run_llama(llama, gguf, "-p " + plist + " -n 0", threads)) {
          f.gbs = bw;
          record(f);
        }
      }
      bw = probe.gbs();
      for (Figure f : run_llama(llama, gguf, "-p 0 -n " + std::to_string(decode) + " -d " + std::to_string(depth), threads)) {
        f.gbs = bw;
        record(f);
      }
    }
    for (Epmoe& e : runs) {
      for (int n : prefill) {
        const double bw = probe.gbs();
        Figure f = time_prefill(e, n, 100 + uint64_t(c));
        f.who = e.who;
        f.what = "prefill " + std::to_string(n);
        f.gbs = bw;
        record(f);
      }
      const double bw = probe.gbs();
      Figure f = time_decode(e, decode, depth, 200 + uint64_t(c));
      f.who = e.who;
      f.what = "decode " + std::to_string(decode) + " @" + std::to_string(depth);
      f.gbs = bw;
      record(f);
    }
  }

  // Medians per (who, what), and ratios to llama.cpp's.
  std::vector<std::string> whos, whats;
  std::map<std::pair<std::string, std::string>, std::vector<const Figure*>> by;
  for (const Figure& f : all) {
    if (std::find(whos.begin(), whos.end(), f.who) == whos.end()) whos.push_back(f.who);
    if (std::find(whats.begin(), whats.end(), f.what) == whats.end()) whats.push_back(f.what);
    by[{f.who, f.what}].push_back(&f);
  }
  auto med = [&](const std::string& who, const std::string& what, auto get) {
    std::vector<double> v;
    for (const Figure* f : by[{who, what}]) v.push_back(get(*f));
    return median(v);
  };
  std::printf("\nmedians of %d cycles, tok/s (x: ratio to llama.cpp's median in this run; [read GB/s, median])\n", cycles);
  std::printf("| |");
  for (const auto& w : whats) std::printf(" %s |", w.c_str());
  std::printf("\n|---|");
  for (size_t i = 0; i < whats.size(); i++) std::printf("---|");
  std::printf("\n");
  for (const auto& who : whos) {
    std::printf("| %s |", who.c_str());
    for (const auto& what : whats) {
      if (by[{who, what}].empty()) {
        std::printf(" - |");
        continue;
      }
      const double v = med(who, what, [](const Figure& f) { return f.tok_s; });
      const double bw = med(who, what, [](const Figure& f) { return f.gbs; });
      const double ref = by[{"llama.cpp", what}].empty() ? 0 : med("llama.cpp", what, [](const Figure& f) { return f.tok_s; });
      if (ref > 0 && who != "llama.cpp") std::printf(" %.1f (%.2fx) [%.0f] |", v, v / ref, bw);
      else std::printf(" %.1f [%.0f] |", v, bw);
    }
    std::printf("\n");
  }

  if (stages) {
    std::printf("\nwhere an epmoe step's time goes (ms per step, median of %d cycles; %% of the step)\n", cycles);
    for (const auto& who : whos) {
      if (who == "llama.cpp") continue;
      for (const auto& what : whats) {
        if (by[{who, what}].empty()) continue;
        const double step = med(who, what, [](const Figure& f) { return f.step_s; });
        std::printf("%s, %s: %.2f ms per step\n", who.c_str(), what.c_str(), step * 1e3);
        double claimed = 0;
        for (int s = 0; s < kStages; s++) {
          const double v = med(who, what, [s](const Figure& f) { return f.stages[size_t(s)]; });
          claimed += v;
          if (v > 0) std::printf("  %-20s %9.2f ms %5.1f %%\n", stage_name(Stage(s)), v * 1e3, 100 * v / step);
        }
        std::printf("  %-20s %9.2f ms %5.1f %%\n", "other", (step - claimed) * 1e3, 100 * (step - claimed) / step);
      }
    }
  }
  return 0;
}
