// The MoE layer on one GPU at the Qwen3-30B-A3B shape (hidden 2048, 128 experts, top-8,
// intermediate 768, bf16 weights and activations, fp32 accumulation), M tokens in, routed output
// out: router (split-bf16 tensor cores) -> routing (softmax top-8, renorm) -> plan -> fused
// gate+up GEMM with SwiGLU -> down GEMM to slot rows -> slot-order combine. Random router and
// inputs (uniform-ish routing), L2 flushed before every replay, the layer as one CUDA graph,
// median of the replays. Also each stage alone (its own graph), to show where the time goes.
//
// Then the same layer with the experts of an FP8 block-quantized checkpoint on the fp8 tensor
// cores (moe/cuda/experts.cuh Fp8ExpertRunner: e4m3 codes + a scale per row and 128-block, rows
// in fp32 quantized per token and 128-channel group, fp8 MMAs, h quantized again, fp32 slots),
// beside the bf16 layer: time, ratio, the bytes of expert weights each reads.
//
//   gpu_moe_bench [--out FILE.tsv] [--iters N] [--m 1,8,64,...] [--precision bf16|fp8|both]
//                 [--fp8-out FILE.tsv] [--flush read|write]
//
// Printed, never asserted. Ceilings for the floor: 4.3 TB/s and 790 TFLOP/s (KINDS.md, measured
// on an H200 of this workplace); the copy ceiling is re-measured here and printed beside them.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "graph_timing.cuh"
#include "ep/cuda/plan_combine.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/ops.cuh"
#include "moe/cuda/experts.cuh"
#include "moe/cuda/routing.cuh"

using namespace epmoe;
using namespace epmoe::cuda;

namespace {

constexpr int H = 2048, E = 128, K = 8, I = 768;
constexpr double kBw = 4.3e12, kFlops = 790e12;

struct Bench {
  RouterGpu router;
  ExpertWeightsGpu<bf16> w;
  DeviceArray<int32_t> rep_off, rep_list, offsets, a_rows, c_rows, phys, tiles, num_tiles;
  RouterGpu::Logits lg{};
  DeviceArray<float> x, rlog, wts, y;
  DeviceArray<bf16> xa, h, slots;
  DeviceArray<uint64_t> gids;
  RoutingConfig rc;
  int M = 0;
  // The fp8 layer: the same router, routing and combine; the experts in e4m3.
  Fp8ExpertRunner f8;
  DeviceArray<float> slots_f, y8;

  Bench() {
    w.H = H, w.I = I, w.p0 = 0, w.n_local = E;
    w.w1.reserve(size_t(E) * 2 * I * H);
    w.w2.reserve(size_t(E) * H * I);
    fill_random(w.w1.data(), int64_t(E) * 2 * I * H, 11, 0.04f, stream());
    fill_random(w.w2.data(), int64_t(E) * H * I, 12, 0.06f, stream());
    std::vector<float> wr(size_t(E) * H);
    uint64_t s = 99;
    for (auto& v : wr) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      v = (float(s >> 40) / 16777216.0f * 2.f - 1.f) * 0.04f;
    }
    router.init(wr, E, H, /*split=*/true);
    std::vector<int32_t> off, list;
    for (int e = 0; e <= E; e++) off.push_back(e);
    for (int e = 0; e < E; e++) list.push_back(e);
    rep_off.upload(off);
    rep_list.upload(list);
    rc.kind = RoutingKind::SoftmaxTopK;
    rc.num_experts = E;
    rc.top_k = K;
    rc.norm_topk_prob = true;
  }

  // Codes uniform in value over [-448, 448] times a scale of 0.04 / 448 (gate/up) and 0.06 / 448
  // (down), each row and block its own scale within +-10 %: the bf16 weights' distribution.
  void init_fp8() {
    f8.init(H, I, 0, E);
    fill_fp8(f8.w1.data(), size_t(E) * 2 * I * f8.Hp, 21);
    fill_fp8(f8.w2.data(), size_t(E) * H * f8.Ip, 22);
    auto scales = [](size_t n, float base, uint64_t seed) {
      std::vector<float> v(n);
      for (auto& f : v) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        f = base / 448.0f * (0.9f + 0.2f * float(seed >> 40) / 16777216.0f);
      }
      return v;
    };
    f8.s1.upload(scales(size_t(E) * (f8.Hp / kFp8Block) * 2 * I, 0.04f, 5));
    f8.s2.upload(scales(size_t(E) * (f8.Ip / kFp8Block) * H, 0.06f, 6));
  }
  static void fill_fp8(uint8_t* p, size_t n, uint64_t seed);

  void setup(int m) {
    M = m;  // (hint() below reads M)
    const size_t t = size_t(m);
    x.reserve(t * H);
    xa.reserve(t * H);
    rlog.reserve(t * E);
    wts.reserve(t * K);
    phys.reserve(t * K);
    y.reserve(t * H);
    gids.reserve(t);
    offsets.reserve(E + 1);
    a_rows.reserve(t * K);
    c_rows.reserve(t * K);
    h.reserve(t * K * I);
    slots.reserve(t * K * H);
    tiles.reserve(2 * size_t(plan_max_tiles(m, K, E, gemm_tile_m(hint()))));
    num_tiles.reserve(1);
    fill_random(x.data(), int64_t(t) * H, 1000 + m, 1.7f, stream());
    convert<bf16>(x.data(), xa.data(), int64_t(t) * H, stream());
    std::vector<uint64_t> g(t);
    for (size_t i = 0; i < t; i++) g[i] = i;
    gids.upload(g);
  }

  void stage_router() { lg = router.run(x.data(), M, stream()); }
  void stage_route() {
    RouteArgs a;
    a.cfg = rc;
    a.logits = lg.ptr;
    a.parts = lg.parts;
    a.part_stride = lg.stride;
    a.identity = true;
    a.T = M;
    a.gids = gids.data();
    a.rep_off = rep_off.data();
    a.rep_list = rep_list.data();
    a.physical = phys.data();
    a.weights = wts.data();
    route(a, stream());
  }
  void stage_plan() {
    PlanArgs p;
    p.phys = phys.data();
    p.phys_stride = K;
    p.rows = M;
    p.K = K;
    p.p0 = 0;
    p.n_local = E;
    p.offsets = offsets.data();
    p.a_rows = a_rows.data();
    p.c_rows = c_rows.data();
    p.tile_m = gemm_tile_m(hint());
    p.tiles = tiles.data();
    p.num_tiles = num_tiles.data();
    plan(p, stream());
  }
  void use_tiles(GemmArgs& g) {
    g.tiles = tiles.data(), g.num_tiles = num_tiles.data();
    g.max_tiles = plan_max_tiles(M, K, E, gemm_tile_m(hint()));
  }
  int hint() const { return std::max(1, ceil_div(int64_t(M) * K, E)); }
  void stage_gemm1() {
    GemmArgs g;
    g.A = xa.data(), g.lda = H, g.a_rows = a_rows.data();
    g.B = w.w1.data(), g.ldb = H, g.b_group_stride = int64_t(2) * I * H;
    g.offsets = offsets.data(), g.G = E, g.rows_hint = hint();
    g.N = 2 * I, g.K = H, g.C = h.data(), g.ldc = I;
    use_tiles(g);
    gemm<bf16, bf16>(g, Epilogue::SwiGLU, stream());
  }
  void stage_gemm2() {
    GemmArgs g;
    g.A = h.data(), g.lda = I;
    g.B = w.w2.data(), g.ldb = I, g.b_group_stride = int64_t(H) * I;
    g.offsets = offsets.data(), g.G = E, g.rows_hint = hint();
    g.N = H, g.K = I, g.C = slots.data(), g.ldc = H, g.c_rows = c_rows.data();
    g.plan_precedes_a = true;  // as ExpertRunnerGpu: gate+up waited for the plan
    use_tiles(g);
    gemm<bf16, bf16>(g, Epilogue::Store, stream());
  }
  void stage_combine() { combine_slots(slots.data(), nullptr, wts.data(), M, H, K, 1.0f, y.data(), stream()); }
  void layer() {
    stage_router();
    stage_route();
    stage_plan();
    stage_gemm1();
    stage_gemm2();
    stage_combine();
  }
  // The two expert GEMMs alone (what the sglang anchor's GEMM-only figure times).
  void gemms_bf16() {
    stage_gemm1();
    stage_gemm2();
  }
  // The bf16 experts alone: plan + gate/up + down.
  void experts_bf16() {
    stage_plan();
    stage_gemm1();
    stage_gemm2();
  }
  // The fp8 experts alone: plan, quantize x, gate/up, quantize h, down (the runner of the model).
  void experts_fp8() {
    slots_f.reserve(size_t(M) * K * H);
    ExpertJobs j;
    j.x = x.data();
    j.x_stride = H;
    j.phys = phys.data();
    j.phys_stride = K;
    j.rows = M;
    j.K = K;
    f8.run(j, slots_f.data());
  }
  void layer_fp8() {
    y8.reserve(size_t(M) * H);
    stage_router();
    stage_route();
    experts_fp8();
    combine_slots(slots_f.data(), nullptr, wts.data(), M, H, K, 1.0f, y8.data(), stream());
  }
};

__global__ void fill_fp8_kernel(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = float(z >> 40) / 16777216.0f * 2.0f - 1.0f;
    p[i] = __nv_cvt_float_to_fp8(u * 448.0f, __NV_SATFINITE, __NV_E4M3);
  }
}
void Bench::fill_fp8(uint8_t* p, size_t n, uint64_t seed) {
  fill_fp8_kernel<<<sm_count() * 8, 256, 0, stream()>>>(p, n, seed);
  EPMOE_CUDA_LAUNCHED();
}

DeviceArray<unsigned char> g_flush;
DeviceArray<float> g_flush_sink;
constexpr size_t kFlushBytes = size_t(512) << 20;
// read (the default, as the sglang anchor flushes): every replay starts with none of its weights
// in L2 and no dirty lines to write back. write: a 512 MiB memset, the flush of runs 1-13, which
// leaves dirty lines that the timed replay pays for.
bool g_flush_write = false;

// Reads kFlushBytes (16 bytes per thread per step); one float per block so the reads are kept.
__global__ void flush_read_kernel(const uint4* __restrict__ p, size_t n, float* sink) {
  uint32_t acc = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = float(acc);  // practically never; the compiler cannot know
}

void flush_l2(int i) {
  if (g_flush_write) {
    EPMOE_CUDA_CHECK(cudaMemsetAsync(g_flush.data(), i & 0xff, kFlushBytes, stream()));
    return;
  }
  const int blocks = sm_count() * 4;
  flush_read_kernel<<<blocks, 512, 0, stream()>>>(reinterpret_cast<const uint4*>(g_flush.data()), kFlushBytes / 16,
                                                  g_flush_sink.data());
  EPMOE_CUDA_LAUNCHED();
}

using bench::capture;

// Median microseconds of `iters` replays, each after an L2 flush (flush_l2).
double time_graph(cudaGraphExec_t ge, int iters, bool flush = true) {
  const auto us = bench::replay_us(ge, iters, 3, [&](int i) {
    if (flush) flush_l2(i);
  });
  return us[us.size() / 2];
}

__global__ void copy16(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

// Read + write bytes per second of a 16-byte-per-thread copy kernel over 2 GB (the KINDS.md ceiling
// was read with a PyTorch device copy).
double copy_kernel_bandwidth() {
  const size_t n = size_t(2) << 30;
  DeviceArray<unsigned char> src(n), dst(n);
  EPMOE_CUDA_CHECK(cudaMemset(src.data(), 1, n));
  auto ge = capture([&] {
    copy16<<<sm_count() * 8, 512, 0, stream()>>>(reinterpret_cast<const uint4*>(src.data()),
                                                  reinterpret_cast<uint4*>(dst.data()), n / 16);
  });
  const double us = time_graph(ge, 10, false);
  cudaGraphExecDestroy(ge);
  return 2.0 * double(n) / (us * 1e-6);
}

double copy_bandwidth() {
  const size_t n = size_t(2) << 30;
  DeviceArray<unsigned char> src(n), dst(n);
  EPMOE_CUDA_CHECK(cudaMemset(src.data(), 1, n));
  auto ge = capture([&] { EPMOE_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), n, cudaMemcpyDeviceToDevice, stream())); });
  const double us = time_graph(ge, 10, false);
  cudaGraphExecDestroy(ge);
  return 2.0 * double(n) / (us * 1e-6);
}

// The fp8 layer beside the bf16 one, M by M in the same process: whole layer (one graph, L2
// flushed, median), the experts alone, the distinct experts' weight bytes each reads.
void run_fp8(Bench& b, const std::vector<int>& Ms, int iters, const std::string& out) {
  b.init_fp8();
  const double bf16_expert = 3.0 * H * I * 2, fp8_expert = double(b.f8.expert_bytes());
  FILE* f = out.empty() ? nullptr : std::fopen(out.c_str(), "w");
  if (f)
    std::fprintf(f, "M\tdistinct\tbf16_us\tfp8_us\tratio\tbf16_experts_us\tfp8_experts_us\tbf16_weight_bytes\t"
                    "fp8_weight_bytes\tfp8_weight_GBps\tdeterministic\n");
  std::printf("\nfp8 experts (e4m3 codes + fp32 scales per row and 128-block, %.0f bytes per expert against %.0f in bf16)\n",
              fp8_expert, bf16_expert);
  std::printf("\n| M | distinct | bf16 layer us | fp8 layer us | fp8 / bf16 | bf16 experts us | fp8 experts us | "
              "bf16 weights MB | fp8 weights MB | fp8 weights GB/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (int M : Ms) {
    b.setup(M);
    for (int w = 0; w < 3; w++) b.layer(), b.layer_fp8();
    EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
    auto g16 = capture([&] { b.layer(); });
    auto g8 = capture([&] { b.layer_fp8(); });
    auto e16 = capture([&] { b.experts_bf16(); });
    auto e8 = capture([&] { b.experts_fp8(); });
    const double us16 = time_graph(g16, iters), us8 = time_graph(g8, iters);
    const double ex16 = time_graph(e16, iters), ex8 = time_graph(e8, iters);
    std::vector<float> y1 = b.y8.download(size_t(M) * H);
    EPMOE_CUDA_CHECK(cudaGraphLaunch(g8, stream()));
    EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
    std::vector<float> y2 = b.y8.download(size_t(M) * H);
    bool finite = true;
    for (float v : y1) finite &= std::isfinite(v);
    const bool same = std::memcmp(y1.data(), y2.data(), y1.size() * 4) == 0 && finite;
    std::vector<int32_t> ph = b.phys.download(size_t(M) * K);
    const size_t distinct = std::set<int32_t>(ph.begin(), ph.end()).size();
    const double w16 = double(distinct) * bf16_expert, w8 = double(distinct) * fp8_expert;
    std::printf("| %d | %zu | %.1f | %.1f | %.2f | %.1f | %.1f | %.1f | %.1f | %.0f |%s\n", M, distinct, us16, us8,
                us8 / us16, ex16, ex8, w16 / 1e6, w8 / 1e6, w8 / (ex8 * 1e-6) / 1e9, same ? "" : " NOT DETERMINISTIC/FINITE");
    if (f)
      std::fprintf(f, "%d\t%zu\t%.2f\t%.2f\t%.3f\t%.2f\t%.2f\t%.6g\t%.6g\t%.1f\t%d\n", M, distinct, us16, us8, us8 / us16,
                   ex16, ex8, w16, w8, w8 / (ex8 * 1e-6) / 1e9, same);
    for (auto* g : {g16, g8, e16, e8}) cudaGraphExecDestroy(g);
  }
  if (f) std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, fp8_out, precision = "both";
  int iters = 30;
  std::vector<int> Ms = {1, 8, 64, 256, 1024, 4096};
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) out = argv[++i];
    else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (a == "--fp8-out" && i + 1 < argc) fp8_out = argv[++i];
    else if (a == "--precision" && i + 1 < argc) precision = argv[++i];
    else if (a == "--flush" && i + 1 < argc) {
      const std::string m = argv[++i];
      if (m != "read" && m != "write") {
        std::fprintf(stderr, "gpu_moe_bench: --flush read|write, not %s\n", m.c_str());
        return 2;
      }
      g_flush_write = m == "write";
    }
    else if (a == "--m" && i + 1 < argc) {
      Ms.clear();
      std::string s = argv[++i];
      for (size_t p = 0; p < s.size();) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        Ms.push_back(std::stoi(s.substr(p, q - p)));
        p = q + 1;
      }
    }
  }
  if (precision != "bf16" && precision != "fp8" && precision != "both") {
    std::fprintf(stderr, "gpu_moe_bench: --precision bf16|fp8|both, not %s\n", precision.c_str());
    return 2;
  }
  try {
    init_device(0);
    g_flush.reserve(kFlushBytes);
    g_flush_sink.reserve(size_t(sm_count()) * 4);
    EPMOE_CUDA_CHECK(cudaMemsetAsync(g_flush.data(), 1, kFlushBytes, stream()));
    const double bw = copy_bandwidth(), bwk = copy_kernel_bandwidth();
    std::printf("device-to-device copy: cudaMemcpy %.2f TB/s, 16-byte copy kernel %.2f TB/s (read + write); "
                "ceilings used: %.1f TB/s, %.0f TFLOP/s\n", bw / 1e12, bwk / 1e12, kBw / 1e12, kFlops / 1e12);
    Bench b;
    const bool do_bf16 = precision != "fp8", do_fp8 = precision != "bf16";
    if (do_bf16) {
      FILE* f = out.empty() ? nullptr : std::fopen(out.c_str(), "w");
      if (f)
        std::fprintf(f, "M\tus\tgemms_us\tbytes\tflops\tfloor_us\tratio\tdistinct\trouter_us\troute_us\tplan_us\tgemm1_us\tgemm2_us\tcombine_us\tdeterministic\n");
      std::printf("\n| M | us | GEMMs us | distinct experts | bytes | FLOPs | floor us | / floor | router | route | plan | gate+up | down | combine |\n");
      std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
      for (int M : Ms) {
        b.setup(M);
        for (int w = 0; w < 3; w++) b.layer();  // grows buffers, sets kernel attributes
        EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
        auto ge = capture([&] { b.layer(); });
        const double us = time_graph(ge, iters);
        // Determinism at scale: two replays give the same bits.
        std::vector<float> y1 = b.y.download(size_t(M) * H);
        EPMOE_CUDA_CHECK(cudaGraphLaunch(ge, stream()));
        EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
        std::vector<float> y2 = b.y.download(size_t(M) * H);
        bool finite = true;
        for (float v : y1) finite &= std::isfinite(v);
        const bool same = std::memcmp(y1.data(), y2.data(), y1.size() * 4) == 0 && finite;
        std::vector<int32_t> ph = b.phys.download(size_t(M) * K);
        std::set<int32_t> distinct(ph.begin(), ph.end());
        const double bytes = double(distinct.size()) * 3.0 * H * I * 2 + double(M) * H * (2 + 4);
        const double flops = 2.0 * M * K * 3.0 * H * I;
        const double floor_us = std::max(bytes / kBw, flops / kFlops) * 1e6;
        double st[6];
        void (Bench::*stages[6])() = {&Bench::stage_router, &Bench::stage_route, &Bench::stage_plan,
                                      &Bench::stage_gemm1, &Bench::stage_gemm2, &Bench::stage_combine};
        for (int s = 0; s < 6; s++) {
          auto gs = capture([&] { (b.*stages[s])(); });
          st[s] = time_graph(gs, iters);
          cudaGraphExecDestroy(gs);
        }
        auto gg = capture([&] { b.gemms_bf16(); });
        const double gemms_us = time_graph(gg, iters);
        cudaGraphExecDestroy(gg);
        cudaGraphExecDestroy(ge);
        std::printf("| %d | %.1f | %.1f | %zu | %.3g | %.3g | %.1f | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |%s\n", M, us, gemms_us,
                    distinct.size(), bytes, flops, floor_us, us / floor_us, st[0], st[1], st[2], st[3], st[4], st[5],
                    same ? "" : " NOT DETERMINISTIC/FINITE");
        if (f)
          std::fprintf(f, "%d\t%.2f\t%.2f\t%.6g\t%.6g\t%.2f\t%.3f\t%zu\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%d\n", M, us, gemms_us, bytes,
                       flops, floor_us, us / floor_us, distinct.size(), st[0], st[1], st[2], st[3], st[4], st[5], same);
      }
      if (f) std::fclose(f);
    }
    if (do_fp8) run_fp8(b, Ms, iters, fp8_out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_moe_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
