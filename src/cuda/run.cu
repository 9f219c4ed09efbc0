#include "cuda/run.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cuda/model.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "util/error.h"

namespace epmoe::cuda {

namespace {

struct GpuRuntime {
  GpuGroup* group = nullptr;
  ModelConfig cfg;
  std::unique_ptr<Checkpoint> ckpt;
  Placement placement;
  std::unique_ptr<GpuModel> model;
  std::unique_ptr<GpuBackend> backend;
};

GpuRuntime make_gpu_runtime(const CudaRunOptions& o) {
  if (o.compute != "bf16" && o.compute != "f32") throw InputError("--compute '" + o.compute + "': choose bf16 or f32");
  GpuRuntime rt;
  rt.group = &GpuGroup::world();
  rt.group->set_timeout(o.comm_timeout);
  rt.cfg = load_model_config(o.model_dir);
  rt.ckpt = std::make_unique<Checkpoint>(o.model_dir);
  const int E = rt.cfg.routing.num_experts, R = rt.group->size();
  rt.placement = o.placement_file.empty() ? Placement::make_default(E, R, o.redundant_experts)
                                          : Placement::from_file(o.placement_file, E, R);
  GpuBackendOptions bo;
  bo.max_dispatch_tokens_per_rank = o.max_dispatch_tokens_per_rank;
  rt.backend = make_gpu_backend(o.backend, *rt.group, rt.placement, bo);
  GpuOptions go;
  go.f32 = o.compute == "f32";
  rt.model = std::make_unique<GpuModel>(rt.cfg, *rt.ckpt, rt.placement, rt.group->rank(), go);
  return rt;
}

void check_finite(const std::vector<float>& v, const char* what) {
  for (size_t i = 0; i < v.size(); i++)
    if (!std::isfinite(v[i]))
      throw CheckError(std::string("--check-numerics: ") + what + " produced " + (std::isnan(v[i]) ? "NaN" : "Inf") +
                       " (element " + std::to_string(i) + ")");
}

}  // namespace

void cuda_score(const CudaRunOptions& o, const std::vector<int32_t>& ids, const std::string& out) {
  GpuRuntime rt = make_gpu_runtime(o);
  const bool mine = rt.group->rank() == 0;
  GpuSequence seq = rt.model->new_sequence(0);
  std::vector<GpuSequence*> seqs;
  std::vector<std::vector<int32_t>> toks;
  if (mine) {
    seqs.push_back(&seq);
    toks.push_back(ids);
  }
  auto logits = rt.model->forward(seqs, toks, *rt.backend, /*all_logits=*/true);
  if (mine) {
    if (o.check_numerics) check_finite(logits[0], "logits");
    const int64_t V = rt.cfg.vocab_size;
    write_safetensors(out, {{"logits", DType::F32, {int64_t(ids.size()), V}, logits[0].data()}},
                      {{"model", o.model_dir}, {"device", "cuda"}, {"compute", o.compute}});
    std::fprintf(stderr, "epmoe score: %zu positions x %lld logits -> %s (cuda, %s, %d GPU%s)\n", ids.size(),
                 (long long)V, out.c_str(), o.compute.c_str(), rt.group->size(), rt.group->size() > 1 ? "s" : "");
  }
}

std::vector<std::vector<int32_t>> cuda_generate(const CudaRunOptions& o, const std::vector<std::vector<int32_t>>& prompts,
                                                int max_new_tokens, const std::vector<int>& stop_ids, int* rank) {
  GpuRuntime rt = make_gpu_runtime(o);
  GpuGroup& g = *rt.group;
  const int R = g.size(), me = g.rank();
  if (rank) *rank = me;
  const int64_t V = rt.cfg.vocab_size;
  std::vector<size_t> mine;
  for (size_t i = 0; i < prompts.size(); i++)
    if (int(i % size_t(R)) == me) mine.push_back(i);
  std::vector<GpuSequence> seqs;
  for (size_t i : mine) seqs.push_back(rt.model->new_sequence(i));
  std::vector<std::vector<int32_t>> out(mine.size()), feed(mine.size());
  std::vector<bool> done(mine.size(), max_new_tokens <= 0);
  for (size_t a = 0; a < mine.size(); a++) feed[a] = prompts[mine[a]];
  for (;;) {
    std::vector<GpuSequence*> active;
    std::vector<std::vector<int32_t>> tokens;
    std::vector<size_t> index;
    for (size_t a = 0; a < mine.size(); a++)
      if (!done[a] && !feed[a].empty()) {
        active.push_back(&seqs[a]);
        tokens.push_back(feed[a]);
        index.push_back(a);
      }
    // Lockstep: a rank without work still runs the step (T = 0) while any rank has work.
    if (!g.any(!active.empty())) break;
    std::vector<int32_t> greedy;
    std::vector<std::vector<float>> logits;
    if (o.check_numerics) logits = rt.model->forward(active, tokens, *rt.backend, /*all_logits=*/false);
    else greedy = rt.model->forward_greedy(active, tokens, *rt.backend);  // argmax on the device
    for (size_t q = 0; q < active.size(); q++) {
      const size_t a = index[q];
      if (o.check_numerics) check_finite(logits[q], "logits");
      const int32_t next = o.check_numerics ? argmax(logits[q].data(), V) : greedy[q];
      out[a].push_back(next);
      feed[a] = {next};
      const bool stop = std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end();
      if (stop || int(out[a].size()) >= max_new_tokens) done[a] = true;
    }
  }
  // Every rank's results, in input order: [prompt index, n, tokens...] padded to a common length.
  std::vector<int64_t> packed;
  for (size_t a = 0; a < mine.size(); a++) {
    packed.push_back(int64_t(mine[a]));
    packed.push_back(int64_t(out[a].size()));
    packed.insert(packed.end(), out[a].begin(), out[a].end());
  }
  const int64_t len = g.allreduce_max(int64_t(packed.size()));
  packed.resize(size_t(len), -1);
  const std::vector<int64_t> all = g.allgather(packed);
  std::vector<std::vector<int32_t>> res(prompts.size());
  for (int r = 0; r < R; r++) {
    size_t i = size_t(r) * size_t(len);
    const size_t end = i + size_t(len);
    while (i + 1 < end && all[i] >= 0) {
      const size_t id = size_t(all[i]), n = size_t(all[i + 1]);
      for (size_t q = 0; q < n; q++) res[id].push_back(int32_t(all[i + 2 + q]));
      i += 2 + n;
    }
  }
  return res;
}

std::vector<int> cuda_model_eos(const std::string& model_dir) { return load_model_config(model_dir).eos_token_ids; }

}  // namespace epmoe::cuda
