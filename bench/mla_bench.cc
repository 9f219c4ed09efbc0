// Decode attention of multi-head latent attention (DeepSeek-V2-Lite, DeepSeek-V3 and GLM-4.7-Flash
// shapes) against a per-head KV cache of the same model, one layer, one new token, at several
// context lengths, single-threaded and with every thread:
//   - latent (what model.cc runs): the cache holds [latent | k_rope] per token (kv_lora_rank +
//     qk_rope_head_dim floats); the query is absorbed (W_UK^T q_nope per head), a score is one dot
//     product with a cache row, the context is sum p_j latent_j, and the value comes out through
//     W_UV per head;
//   - per head (what an engine without absorption caches): k = [k_nope | k_rope] and v per head
//     per token (heads x (qk_head_dim + v_head_dim) floats), scores over k, context over v.
// The latent form is the model's own code (kernels/latent_attention.h, the absorption and W_UV matmuls); the
// per-head form is a plain loop per head with the same vector kernels (kernels/vec.h dot and
// axpy), as model.cc's standard attention runs. Both caches fp32. Printed: KV bytes per token and layer, time per decode step, and the ratio.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/latent_attention.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/vec.h"
#include "model/model.h"
#include "util/threads.h"

using namespace epmoe;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Shape {
  const char* name;
  int heads, nope, rope, v, latent;
};

std::vector<float> random_vec(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(n);
  for (auto& v : x) v = u(rng);
  return x;
}

// One decode step of the latent form over `ctx` cached tokens: seconds (median of reps).
double latent_step(const Shape& s, int64_t ctx, const std::vector<float>& cache, const std::vector<float>& uk_t,
                   const std::vector<float>& uv, const std::vector<float>& q, std::vector<float>& out, int reps) {
  const int64_t W = s.latent + s.rope, C = s.latent, qk = s.nope + s.rope;
  std::vector<double> t;
  for (int r = 0; r < reps; r++) {
    const double t0 = now();
    std::vector<float> qc(size_t(s.heads) * size_t(W)), ctxl(size_t(s.heads) * size_t(C));
    for (int h = 0; h < s.heads; h++) {
      TensorView ukh;
      ukh.dtype = DType::F32;
      ukh.shape = {C, s.nope};
      ukh.data = &uk_t[size_t(h) * size_t(C * s.nope)];
      matmul(&q[size_t(h * qk)], 1, ukh, &qc[size_t(h * W)], ComputeMode::F32);  // fp32 weights
      std::copy(&q[size_t(h * qk + s.nope)], &q[size_t(h * qk + qk)], &qc[size_t(h * W + C)]);
    }
    std::vector<float> p;
    latent_attention(qc.data(), s.heads, W, C, ctx, 16, [&](int64_t blk) { return &cache[size_t(blk * 16 * W)]; },
                     0.1f, ctxl.data(), p);
    for (int h = 0; h < s.heads; h++) {
      TensorView uvh;
      uvh.dtype = DType::F32;
      uvh.shape = {s.v, C};
      uvh.data = &uv[size_t(h) * size_t(s.v * C)];
      matmul(&ctxl[size_t(h * C)], 1, uvh, &out[size_t(h * s.v)], ComputeMode::F32);
    }
    t.push_back(now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double per_head_step(const Shape& s, int64_t ctx, const std::vector<float>& k, const std::vector<float>& v,
                     const std::vector<float>& q, std::vector<float>& out, int reps) {
  const int64_t qk = s.nope + s.rope, kd = int64_t(s.heads) * qk, vd = int64_t(s.heads) * s.v;
  std::vector<double> t;
  for (int r = 0; r < reps; r++) {
    const double t0 = now();
    parallel_for(s.heads, 1, [&](int64_t b, int64_t e) {
      std::vector<float> p(static_cast<size_t>(ctx));
      for (int64_t h = b; h < e; h++) {
        const float* qh = &q[size_t(h * qk)];
        for (int64_t j = 0; j < ctx; j++) p[size_t(j)] = dot(qh, &k[size_t(j * kd + h * qk)], qk) * 0.1f;
        softmax(p.data(), ctx);
        float* o = &out[size_t(h * s.v)];
        std::fill(o, o + s.v, 0.f);
        for (int64_t j = 0; j < ctx; j++) axpy(p[size_t(j)], &v[size_t(j * vd + h * s.v)], o, s.v);
      }
    });
    t.push_back(now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t max_ctx = 16384;
  for (int i = 1; i + 1 < argc; i++)
    if (std::string(argv[i]) == "--max-context") max_ctx = std::stoll(argv[i + 1]);
  const Shape shapes[] = {{"deepseek-v2-lite", 16, 128, 64, 128, 512},
                          {"glm-4.7-flash", 20, 192, 64, 256, 512},
                          {"deepseek-v3", 128, 128, 64, 128, 512}};
  std::mt19937 rng(1);
  std::printf("MLA decode attention, one layer, one new token, fp32 caches, %d threads (median of 7)\n", num_threads());
  std::printf("%-17s %7s | %12s %12s %6s | %10s %10s %7s\n", "model", "context", "latent B/tok", "head B/tok", "ratio",
              "latent ms", "head ms", "speedup");
  for (const Shape& s : shapes) {
    const int64_t W = s.latent + s.rope, qk = s.nope + s.rope;
    const int64_t head_floats = int64_t(s.heads) * (qk + s.v);
    for (int64_t ctx = 1024; ctx <= max_ctx; ctx *= 4) {
      if (size_t(ctx) * size_t(head_floats) * 4 > (size_t(6) << 30)) break;  // keep the per-head cache under 6 GB
      const auto cache = random_vec(size_t(ctx * W), rng);
      const auto k = random_vec(size_t(ctx) * size_t(s.heads) * size_t(qk), rng);
      const auto v = random_vec(size_t(ctx) * size_t(s.heads) * size_t(s.v), rng);
      const auto uk_t = random_vec(size_t(s.heads) * size_t(s.latent * s.nope), rng);
      const auto uv = random_vec(size_t(s.heads) * size_t(s.v * s.latent), rng);
      const auto q = random_vec(size_t(s.heads * qk), rng);
      std::vector<float> out(size_t(s.heads * s.v));
      const double tl = latent_step(s, ctx, cache, uk_t, uv, q, out, 7);
      const double th = per_head_step(s, ctx, k, v, q, out, 7);
      std::printf("%-17s %7lld | %12lld %12lld %5.1fx | %10.3f %10.3f %6.2fx\n", s.name, (long long)ctx,
                  (long long)(W * 4), (long long)(head_floats * 4), double(head_floats) / double(W), tl * 1e3, th * 1e3,
                  th / tl);
    }
  }
  return 0;
}
