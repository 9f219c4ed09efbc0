// The MoE layer at Qwen3-30B-A3B shape (hidden 2048, 128 experts, top-8, expert intermediate
// 768, bf16 weights, and the same layer from FP8 experts: e4m3 codes with a bf16 128 x 128 scale
// grid, as Qwen3-30B-A3B-FP8 ships them) against the machine's own limits, measured in the same
// run:
//   - read bandwidth (STREAM-like sum over 1 GB), peak fp32 FMA and peak bf16 dot-product rates;
//   - each row: time, tokens/s, GB/s of distinct expert bytes read, GFLOP/s, the ratio to the
//     limit that binds it (bandwidth or compute, whichever gives the longer floor), and the ratio
//     to a plain baseline: per-expert OpenBLAS sgemm on fp32 copies of the weights (bf16 rows);
//   - fp8 rows: the same, and the fp8 / bf16 speed ratio on the same inputs and routings (decode
//     is bandwidth-bound: one byte per weight instead of two should approach 2x).
// Experts are cold: 1.2 GB of bf16 weights (0.6 GB fp8) and fresh random routing every iteration
// (L3 is 32 MB).
// With --model DIR (e.g. from `epmoe synth --like qwen3-30b-a3b --layers 4`), also decode and
// prefill tokens/s of the whole model. Figures are printed, never asserted.
#include <cblas.h>
// GCC 12's AVX-512 headers trip -Wuninitialized on their own "undefined" vectors (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "comm/mpi_group.h"
#include "ep/backend.h"
#include "io/checkpoint.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "model/model.h"
#include "moe/moe_layer.h"
#include "util/threads.h"

using namespace epmoe;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// ---- the machine's limits ----

double stream_read_gbs() {
  const size_t n = size_t(1) << 28;  // 1 GiB of floats
  std::vector<float> a(n, 1.0f);
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    std::vector<double> part(size_t(num_threads()), 0.0);
    const double t0 = now();
    parallel_for(int64_t(n / 4096), 64, [&](int64_t b, int64_t e) {
      typedef float v8 __attribute__((vector_size(32)));
      v8 s0 = {}, s1 = {}, s2 = {}, s3 = {};
      for (int64_t blk = b; blk < e; blk++) {
        const float* p = &a[size_t(blk) * 4096];
        for (int i = 0; i < 4096; i += 32) {
          v8 x0, x1, x2, x3;
          std::memcpy(&x0, p + i, 32);
          std::memcpy(&x1, p + i + 8, 32);
          std::memcpy(&x2, p + i + 16, 32);
          std::memcpy(&x3, p + i + 24, 32);
          s0 += x0;
          s1 += x1;
          s2 += x2;
          s3 += x3;
        }
      }
      volatile float sink = (s0 + s1 + s2 + s3)[0];
      (void)sink;
    });
    best = std::max(best, double(n * 4) / (now() - t0) / 1e9);
  }
  return best;
}

__attribute__((target("avx512f,fma"))) double fma_loop(int64_t iters) {
  __m512 a[12];
  for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
  for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);  // unrolled: accumulators in registers
  float s = 0;
  for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
  return s;
}

__attribute__((target("avx512f,avx512bf16"))) double dpbf16_loop(int64_t iters) {
  __m512 a[12];
  for (int i = 0; i < 12; i++) a[i] = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3c00);
  for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) a[i] = _mm512_dpbf16_ps(a[i], x, y);
  float s = 0;
  for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
  return s;
}

// flops_per_iter: 12 instructions x lanes x flops per lane.
template <class F>
double peak_gflops(F loop, double flops_per_iter) {
  const int64_t iters = 20'000'000;
  const int T = num_threads();
  const double t0 = now();
  parallel_for(T, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) {
      volatile double s = loop(iters);
      (void)s;
    }
  });
  return double(T) * double(iters) * flops_per_iter / (now() - t0) / 1e9;
}

// ---- the layer ----

constexpr int H = 2048, I = 768, E = 128, K = 8;

struct Experts {
  std::vector<uint16_t> bf16;        // [E][gate I*H | up I*H | down H*I]
  std::vector<float> f32;            // fp32 copies for the OpenBLAS baseline
  MoeLayerWeights w;
  size_t per_expert() const { return size_t(3) * I * H; }
};

void make_experts(Experts& x) {
  const size_t per = x.per_expert();
  x.bf16.resize(per * E);
  x.f32.resize(per * E);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < x.bf16.size(); i++) {
    const float v = (float(rng() >> 40) / 16777216.0f - 0.5f) * 0.07f;
    x.bf16[i] = f32_to_bf16(v);
    x.f32[i] = bf16_to_f32(x.bf16[i]);
  }
  for (int e = 0; e < E; e++) {
    const uint16_t* base = &x.bf16[per * size_t(e)];
    SwigluWeights s;
    s.gate = {DType::BF16, {I, H}, base, "gate", {}};
    s.up = {DType::BF16, {I, H}, base + size_t(I) * H, "up", {}};
    s.down = {DType::BF16, {H, I}, base + size_t(2) * I * H, "down", {}};
    x.w.experts[e] = s;
  }
}

// The same layer from FP8 experts: e4m3 codes and a bf16 scale grid per 128 x 128 block.
struct Fp8Experts {
  std::vector<uint8_t> q;        // [E][gate I*H | up I*H | down H*I]
  std::vector<uint16_t> scales;  // [E][gate grid | up grid | down grid], bf16
  MoeLayerWeights w;
  static constexpr int kGrid = (I / 128) * (H / 128);  // 6 x 16 (gate, up) or 16 x 6 (down)
  size_t per_expert() const { return size_t(3) * I * H; }
  double bytes_per_expert() const { return double(per_expert()) + 3.0 * kGrid * 2; }
};

// Round to the nearest e4m3 code (ties to even), |v| <= 448.
uint8_t e4m3_encode(float v) {
  static const std::vector<float> mags = [] {
    std::vector<float> m;
    for (int c = 0; c <= 0x7e; c++) m.push_back(fp8e4m3_to_f32(uint8_t(c)));
    return m;
  }();
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const float a = std::min(std::fabs(v), 448.0f);
  const int hi = int(std::lower_bound(mags.begin(), mags.end(), a) - mags.begin());
  if (hi == 0 || mags[size_t(hi)] == a) return sign | uint8_t(hi);
  const float dlo = a - mags[size_t(hi - 1)], dhi = mags[size_t(hi)] - a;
  return sign | uint8_t(dlo < dhi || (dlo == dhi && (hi - 1) % 2 == 0) ? hi - 1 : hi);
}

void make_fp8_experts(Fp8Experts& x) {
  // Codes of gaussian weights quantized with amax / 448 (amax ~ 4.5 sigma), drawn from a pool
  // (the values do not matter for speed, their distribution over the codes might).
  std::mt19937_64 rng(2);
  std::normal_distribution<float> g(0.f, 448.f / 4.5f);
  std::vector<uint8_t> pool(size_t(1) << 20);
  for (auto& c : pool) c = e4m3_encode(g(rng));
  const size_t per = x.per_expert();
  x.q.resize(per * E);
  for (size_t i = 0; i < x.q.size(); i += 4096) {
    const size_t off = size_t(rng() % (pool.size() - 4096));
    std::memcpy(&x.q[i], &pool[off], std::min<size_t>(4096, x.q.size() - i));
  }
  x.scales.resize(size_t(3) * Fp8Experts::kGrid * E);
  for (auto& s : x.scales) s = f32_to_bf16(0.035f / 448.f * (0.75f + float(rng() >> 40) / 16777216.0f * 0.5f));
  for (int e = 0; e < E; e++) {
    const uint8_t* base = &x.q[per * size_t(e)];
    const uint16_t* sg = &x.scales[size_t(3) * Fp8Experts::kGrid * size_t(e)];
    auto view = [](const uint8_t* d, int64_t n, int64_t k, const uint16_t* grid, const char* name) {
      TensorView v{DType::F8_E4M3, {n, k}, d, name, {}};
      v.scale = BlockScale{grid, DType::BF16, n / 128, k / 128, 0, 128};
      return v;
    };
    SwigluWeights s;
    s.gate = view(base, I, H, sg, "gate");
    s.up = view(base + size_t(I) * H, I, H, sg + Fp8Experts::kGrid, "up");
    s.down = view(base + size_t(2) * I * H, H, I, sg + 2 * Fp8Experts::kGrid, "down");
    x.w.experts[e] = s;
  }
}

struct RouteSample {
  std::vector<int32_t> ids;
  std::vector<float> w;
  int distinct = 0;
};

RouteSample random_routing(int64_t T, std::mt19937_64& rng) {
  RouteSample r;
  r.ids.resize(size_t(T * K));
  r.w.assign(size_t(T * K), 1.0f / K);
  std::set<int> all;
  std::vector<int> perm(E);
  for (int64_t t = 0; t < T; t++) {
    for (int e = 0; e < E; e++) perm[size_t(e)] = e;
    for (int k = 0; k < K; k++) {
      std::swap(perm[size_t(k)], perm[size_t(k) + rng() % size_t(E - k)]);
      r.ids[size_t(t * K + k)] = perm[size_t(k)];
      all.insert(perm[size_t(k)]);
    }
  }
  r.distinct = int(all.size());
  return r;
}

// The baseline: gather each expert's tokens, three OpenBLAS sgemms on fp32 weights, scatter.
void baseline_layer(const Experts& x, const float* in, int64_t T, const RouteSample& r, float* y) {
  std::fill(y, y + T * H, 0.0f);
  std::vector<std::vector<int64_t>> rows(E);
  for (int64_t i = 0; i < T * K; i++) rows[size_t(r.ids[size_t(i)])].push_back(i);
  std::vector<float> a, g, u, o;
  for (int e = 0; e < E; e++) {
    const int64_t n = int64_t(rows[size_t(e)].size());
    if (!n) continue;
    a.resize(size_t(n * H));
    g.resize(size_t(n * I));
    u.resize(size_t(n * I));
    o.resize(size_t(n * H));
    for (int64_t j = 0; j < n; j++) std::memcpy(&a[size_t(j * H)], in + rows[size_t(e)][size_t(j)] / K * H, H * 4);
    const float* W = &x.f32[x.per_expert() * size_t(e)];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), I, H, 1.f, a.data(), H, W, H, 0.f, g.data(), I);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), I, H, 1.f, a.data(), H, W + size_t(I) * H, H, 0.f, u.data(), I);
    silu_mul(g.data(), u.data(), n * I, g.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), H, I, 1.f, g.data(), I, W + size_t(2) * I * H, I, 0.f, o.data(), H);
    for (int64_t j = 0; j < n; j++) {
      const int64_t slot = rows[size_t(e)][size_t(j)];
      for (int h = 0; h < H; h++) y[slot / K * H + h] += r.w[size_t(slot)] * o[size_t(j * H + h)];
    }
  }
}

template <class F>
double median_time(int iters, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < iters; i++) {
    const double t0 = now();
    f(i);
    t.push_back(now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void model_throughput(const std::string& dir, ComputeMode mode) {
  ModelConfig cfg = load_model_config(dir);
  Checkpoint ck(dir);
  Placement p = Placement::make_default(cfg.routing.num_experts, 1, 0);
  Model m(cfg, ck, p, 0, mode);
  auto be = make_local_backend(Device::Cpu, p);
  std::mt19937_64 rng(5);
  const int prefill = 512, decode = 16;
  std::vector<int32_t> prompt(prefill);
  for (auto& t : prompt) t = int32_t(rng() % uint64_t(cfg.vocab_size));
  {
    // Warm-up: the first pass faults the mmapped checkpoint in (GBs from the page cache or disk);
    // the figures below are the steady state.
    Sequence warm = m.new_sequence(1);
    m.forward({&warm}, {std::vector<int32_t>(prompt.begin(), prompt.begin() + 64)}, *be, false);
  }
  Sequence s = m.new_sequence(0);
  double t0 = now();
  auto l = m.forward({&s}, {prompt}, *be, false);
  const double t_prefill = now() - t0;
  t0 = now();
  for (int i = 0; i < decode; i++) {
    const int32_t next = argmax(l[0].data(), cfg.vocab_size);
    l = m.forward({&s}, {{next}}, *be, false);
  }
  const double t_decode = now() - t0;
  std::printf("model %s (%d layers), compute %s: prefill %d tokens %.2f s = %.1f tok/s; decode %.1f tok/s (%.1f ms/token)\n",
              dir.c_str(), cfg.num_layers, mode == ComputeMode::BF16 ? "bf16" : "f32", prefill, t_prefill,
              prefill / t_prefill, decode / t_decode, t_decode / decode * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {1, 2, 8, 32, 128, 512, 2048};
  std::string model;
  bool baseline = true;
  bool fp8 = true;
  std::string only;  // --compute f32|bf16: one mode only
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) model = argv[++i];
    else if (a == "--no-baseline") baseline = false;
    else if (a == "--no-fp8") fp8 = false;
    else if (a == "--compute" && i + 1 < argc && (std::string(argv[i + 1]) == "f32" || std::string(argv[i + 1]) == "bf16"))
      only = argv[++i];
    else if (a == "--tokens" && i + 1 < argc) {
      sizes.clear();
      std::string s = argv[++i];
      for (size_t p = 0; p < s.size();) {
        size_t q = s.find(',', p);
        sizes.push_back(std::stoll(s.substr(p, q - p)));
        p = q == std::string::npos ? s.size() : q + 1;
      }
    } else {
      std::fprintf(stderr, "usage: moe_bench [--tokens 1,2,8,32,128,512,2048] [--compute f32|bf16] [--model DIR] [--no-baseline] "
                   "[--no-fp8]\n");
      return 2;
    }
  }
  const CpuFeatures& cpu = cpu_features();
  openblas_set_num_threads(num_threads());
  std::printf("moe_bench: %d threads, %s\n", num_threads(), cpu_features_string().c_str());
  const double bw = stream_read_gbs();
  const double fma_peak = cpu.avx512 ? peak_gflops(fma_loop, 12.0 * 16 * 2) : 0;
  const double bf16_peak = cpu.avx512_bf16 ? peak_gflops(dpbf16_loop, 12.0 * 32 * 2) : 0;
  std::printf("limits: read %.1f GB/s, fp32 FMA %.0f GFLOP/s, bf16 dot %.0f GFLOP/s\n", bw, fma_peak, bf16_peak);

  Experts x;
  make_experts(x);
  Fp8Experts x8;
  if (fp8) make_fp8_experts(x8);
  Placement p = Placement::make_default(E, 1, 0);
  RoutingConfig rc;
  rc.num_experts = E;
  rc.top_k = K;
  auto be = make_local_backend(Device::Cpu, p);
  const double expert_bytes = double(x.per_expert()) * 2;
  std::printf("\nMoE layer: hidden %d, %d experts, top-%d, intermediate %d, bf16 weights (%.1f MB per expert)", H, E, K, I,
              expert_bytes / 1e6);
  if (fp8) std::printf(" and fp8 (%.1f MB per expert, bf16 128x128 scales)", x8.bytes_per_expert() / 1e6);
  std::printf(", cold\n");
  std::printf("%-7s %-7s %6s %10s %10s %8s %9s %-9s %7s %12s %9s\n", "compute", "weights", "tokens", "time ms", "tokens/s",
              "GB/s", "GFLOP/s", "bound", "ratio", "vs OpenBLAS", "fp8/bf16");
  for (ComputeMode mode : {ComputeMode::F32, ComputeMode::BF16}) {
    if (mode == ComputeMode::BF16 && !cpu.avx512_bf16) continue;
    if (!only.empty() && only != (mode == ComputeMode::BF16 ? "bf16" : "f32")) continue;
    CpuExpertRunner experts(x.w, p, /*rank=*/0, H, mode);
    CpuExpertRunner experts8(x8.w, p, /*rank=*/0, H, mode);
    const double peak = mode == ComputeMode::BF16 ? bf16_peak : fma_peak;
    for (int64_t T : sizes) {
      std::mt19937_64 rng(static_cast<uint64_t>(T));
      std::vector<float> in(size_t(T * H)), y(size_t(T * H));
      for (auto& v : in) v = float(rng() >> 40) / 16777216.0f - 0.5f;
      const int iters = T <= 32 ? 9 : T <= 512 ? 5 : 3;
      std::vector<RouteSample> routes;
      for (int i = 0; i < iters; i++) routes.push_back(random_routing(T, rng));
      double distinct = 0;
      for (auto& r : routes) distinct += r.distinct;
      distinct /= iters;
      auto layer = [&](CpuExpertRunner& runner) {
        {  // one untimed pass on its own routing: first-call allocations and the pool's wake-up
          RouteSample warm = random_routing(T, rng);
          MoeTokens tok;
          tok.T = T, tok.H = H, tok.K = K, tok.x = in.data(), tok.physical = warm.ids.data(), tok.weights = warm.w.data();
          be->run(tok, runner, y.data());
        }
        return median_time(iters, [&](int i) {
          std::vector<int32_t> phys = routes[size_t(i)].ids;
          MoeTokens tok;
          tok.T = T, tok.H = H, tok.K = K, tok.x = in.data(), tok.physical = phys.data(),
          tok.weights = routes[size_t(i)].w.data();
          be->run(tok, runner, y.data());
        });
      };
      const double t = layer(experts);
      double tb = 0;
      if (baseline && mode == ComputeMode::F32)
        tb = median_time(iters, [&](int i) { baseline_layer(x, in.data(), T, routes[size_t(i)], y.data()); });
      const double flops = double(T) * K * 3 * 2 * H * I;
      auto row = [&](const char* weights, double time, double per_expert, const std::string& vs_blas, const std::string& vs_bf16) {
        const double bytes = distinct * per_expert;
        const double t_mem = bytes / (bw * 1e9), t_cmp = peak > 0 ? flops / (peak * 1e9) : 0;
        const bool mem_bound = t_mem >= t_cmp;
        std::printf("%-7s %-7s %6lld %10.2f %10.1f %8.1f %9.1f %-9s %6.0f%% %12s %9s\n",
                    mode == ComputeMode::BF16 ? "bf16" : "f32", weights, (long long)T, time * 1e3, double(T) / time,
                    bytes / time / 1e9, flops / time / 1e9, mem_bound ? "memory" : "compute",
                    100.0 * (mem_bound ? t_mem : t_cmp) / time, vs_blas.c_str(), vs_bf16.c_str());
      };
      row("bf16", t, expert_bytes, tb > 0 ? std::to_string(tb / t).substr(0, 5) + "x faster" : "-", "-");
      if (fp8) {
        const double t8 = layer(experts8);
        row("fp8", t8, x8.bytes_per_expert(), "-", std::to_string(t / t8).substr(0, 4) + "x");
      }
    }
  }
  if (!model.empty()) {
    std::printf("\n");
    model_throughput(model, ComputeMode::F32);
    if (cpu.avx512_bf16) model_throughput(model, ComputeMode::BF16);
  }
  return 0;
}
