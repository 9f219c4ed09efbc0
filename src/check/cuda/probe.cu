#include "cuda/check.h"

#include <cmath>
#include <cstring>
#include <random>

#include "cuda/model.h"
#include "cuda/moe.cuh"
#include "io/checkpoint.h"

namespace epmoe::cuda {

namespace {

// Probe experts on the device: physical expert p multiplies its rows by audit_probe_scale(p).
// It serves exactly the jobs the real runner would (same plan), so every backend's dispatch,
// answer layout and combine are exercised; only the arithmetic in between is replaced.
template <class T>
__global__ void probe_kernel(const T* x, int64_t x_stride, const int32_t* offsets, const int32_t* a_rows,
                             const int32_t* c_rows, const float* scale, int H, T* out) {
  const int g = blockIdx.y;
  for (int i = offsets[g] + int(blockIdx.x); i < offsets[g + 1]; i += int(gridDim.x)) {
    const T* src = x + int64_t(a_rows[i]) * x_stride;
    T* dst = out + int64_t(c_rows[i]) * H;
    for (int h = int(threadIdx.x); h < H; h += int(blockDim.x)) dst[h] = T(scale[g] * float(src[h]));
  }
}

class ProbeRunner final : public GpuExpertRunner {
 public:
  ProbeRunner(const Placement& p, int rank, int H) : p0_(p.first_local(rank)), n_(p.num_local(rank)), hidden_(H) {
    std::vector<float> s;
    for (int q = 0; q < n_; q++) s.push_back(audit_probe_scale(p, p0_ + q));
    scale_.upload(s);
  }
  void run(const GpuExpertJobs& j, void* out) override {
    if (!plan_.make(j, p0_, n_, /*tiled=*/false)) return;
    const int64_t cap = j.rows * j.K;
    const dim3 grid(unsigned(std::min<int64_t>(cap, 1024)), unsigned(n_));
    // The audit runs fp32 tokens (probe outputs exact); rows are never bf16 here.
    probe_kernel<float><<<grid, 128, 0, stream()>>>(static_cast<const float*>(j.x), j.x_stride, plan_.offsets.data(),
                                                    plan_.a_rows.data(), plan_.c_rows.data(), scale_.data(), hidden_,
                                                    static_cast<float*>(out));
    EPMOE_CUDA_LAUNCHED();
  }
 private:
  int p0_, n_, hidden_;
  DeviceArray<float> scale_;
  ExpertPlanGpu plan_;
};

// Host values over the group: the GPU group has int64 collectives; a double travels as its bits
// (non-negative doubles order as their bit patterns).
int64_t bits_of(double v) {
  int64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
double from_bits(int64_t b) {
  double v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}
// The GPU group's collectives for the checks' summaries.
GroupReduce group_reduce(GpuGroup& g) {
  return {[&g](int64_t v) { return g.allreduce_sum(v); },
          [&g](double v) { return from_bits(g.allreduce_max(bits_of(v))); },
          [&g](double v) {
            double s = 0;
            for (int64_t b : g.allgather(bits_of(v))) s += from_bits(b);  // rank order: the same sum everywhere
            return s;
          }};
}

AuditResult gpu_audit(GpuGroup& g, const Placement& p, GpuBackend& backend, const AuditOptions& ao) {
  const int R = g.size(), me = g.rank();
  const AuditTokens tok = make_audit_tokens(p, me, R, ao);
  DeviceArray<float> x, w, y, y_ref;
  DeviceArray<int32_t> phys;
  x.upload(tok.x);
  w.upload(tok.w);
  phys.upload(tok.physical);
  const size_t n = size_t(tok.T) * size_t(tok.H);
  y.reserve(n), y_ref.reserve(n);
  GpuMoeTokens in;
  in.T = tok.T, in.H = tok.H, in.K = tok.K, in.bf16 = false;
  in.x = x.data(), in.physical = phys.data(), in.weights = w.data();
  // The bits a correct backend must reproduce: the single-GPU path with every expert local.
  const Placement solo = Placement::make_default(p.num_logical, 1, 0);
  {
    ProbeRunner all(solo, 0, tok.H);
    // The local path takes logical == physical ids of the solo placement.
    DeviceArray<int32_t> logical;
    logical.upload(tok.logical);
    GpuMoeTokens li = in;
    li.physical = logical.data();
    if (n) EPMOE_CUDA_CHECK(cudaMemsetAsync(y_ref.data(), 0xff, n * sizeof(float), stream()));
    const Fault f = injected_fault();
    set_injected_fault(Fault::None);
    make_local_gpu_backend(solo)->run(li, all, y_ref.data());
    set_injected_fault(f);
  }
  ProbeRunner mine(p, me, tok.H);
  if (n) EPMOE_CUDA_CHECK(cudaMemsetAsync(y.data(), 0xff, n * sizeof(float), stream()));  // NaN: rows never written show
  backend.run(in, mine, y.data());
  g.sync("check: reduction audit");
  const std::vector<float> yh = y.download(n), refh = y_ref.download(n);
  return audit_result(tally_audit(p, me, R, tok, yh.data(), refh.data(), /*exact=*/true), group_reduce(g));
}

// Greedy decoding of this rank's sequences, in lockstep with the group (a rank without work
// still runs each step with no tokens, as the backends are collective).
std::vector<std::vector<int32_t>> gpu_greedy(GpuModel& m, GpuBackend& be, GpuGroup& g, const std::vector<uint64_t>& ids,
                                             const std::vector<std::vector<int32_t>>& prompts, int G) {
  std::vector<GpuSequence> seqs;
  for (uint64_t id : ids) seqs.push_back(m.new_sequence(id));
  std::vector<std::vector<int32_t>> out(ids.size()), feed = prompts;
  for (int step = 0; step < G; step++) {
    std::vector<GpuSequence*> active;
    for (auto& s : seqs) active.push_back(&s);
    if (!g.any(!active.empty())) break;
    const std::vector<int32_t> next = m.forward_greedy(active, feed, be);
    for (size_t i = 0; i < ids.size(); i++) {
      out[i].push_back(next[i]);
      feed[i] = {next[i]};
    }
  }
  return out;
}

std::vector<std::vector<float>> gpu_score(GpuModel& m, GpuBackend& be, const std::vector<uint64_t>& ids,
                                          const std::vector<std::vector<int32_t>>& seqs) {
  std::vector<GpuSequence> s;
  for (uint64_t id : ids) s.push_back(m.new_sequence(id));
  std::vector<GpuSequence*> ptrs;
  for (auto& x : s) ptrs.push_back(&x);
  return m.forward(ptrs, seqs, be, /*all_logits=*/true);
}

}  // namespace

CudaCheckResult cuda_check(const CudaCheckOptions& o) {
  GpuGroup& g = GpuGroup::world();
  g.set_timeout(o.run.comm_timeout);
  if (o.run.compute != "bf16" && o.run.compute != "f32") throw InputError("--compute '" + o.run.compute + "': choose bf16 or f32");
  if (o.fault != Fault::None && o.fault != Fault::DoubleReduce)
    throw InputError("--inject " + fault_name(o.fault) + ": the GPU backends implement only double-reduce");
  const ModelConfig cfg = load_model_config(o.run.model_dir);
  Checkpoint ckpt(o.run.model_dir);
  const int R = g.size(), me = g.rank(), E = cfg.routing.num_experts;
  const int64_t V = cfg.vocab_size;
  const Placement place = o.run.placement_file.empty() ? Placement::make_default(E, R, o.run.redundant_experts)
                                                       : Placement::from_file(o.run.placement_file, E, R);
  GpuBackendOptions bo;
  bo.max_dispatch_tokens_per_rank = o.run.max_dispatch_tokens_per_rank;
  std::vector<std::unique_ptr<GpuBackend>> backends;
  for (auto& n : o.backends) backends.push_back(make_gpu_backend(n, g, place, bo));  // InputError on a bad name
  GpuOptions go;
  go.f32 = o.run.compute == "f32";

  // The reference: this rank's prompts (prompt i on rank i mod R), all experts on this GPU.
  ReferenceRun ref;
  {
    std::mt19937_64 rng(o.seed);
    for (int i = 0; i < o.prompts; i++) {
      std::vector<int32_t> p(size_t(o.prompt_len));
      for (auto& t : p) t = int32_t(rng() % uint64_t(V));
      if (i % R == me) {
        ref.ids.push_back(uint64_t(i));
        ref.prompts.push_back(p);
      }
    }
    const Placement solo = Placement::make_default(E, 1, 0);
    GpuModel refm(cfg, ckpt, solo, 0, go);
    auto local = make_local_gpu_backend(solo);
    ref.generated = gpu_greedy(refm, *local, g, ref.ids, ref.prompts, o.gen_tokens);
    ref.logits = gpu_score(refm, *local, ref.ids, full_sequences(ref));
    for (auto& l : ref.logits) ref.logprobs.push_back(log_softmax_rows(l, V));
  }

  GpuModel model(cfg, ckpt, place, me, go);
  CudaCheckResult res;
  res.rank = me, res.ranks = R, res.vocab = int(V);
  for (size_t i = 0; i < backends.size(); i++) {
    set_injected_fault(o.fault);
    CudaCheckRow row;
    row.backend = o.backends[i];
    AuditOptions ao;
    ao.H = cfg.hidden_size;
    ao.K = cfg.routing.top_k;
    ao.tokens_per_rank = bo.max_dispatch_tokens_per_rank + 5;  // bounded backends need a second round
    ao.exact = true;
    row.audit = gpu_audit(g, place, *backends[i], ao);
    const auto logits = gpu_score(model, *backends[i], ref.ids, full_sequences(ref));
    const auto gen = gpu_greedy(model, *backends[i], g, ref.ids, ref.prompts, o.gen_tokens);
    set_injected_fault(Fault::None);
    row.stats = comparison_stats(tally_comparison(ref, logits, gen, V), group_reduce(g));
    res.rows.push_back(row);
  }
  return res;
}

}  // namespace epmoe::cuda
