// The MoE layer on one GPU at the Qwen3-30B-A3B shape (hidden 2048, 128 experts, top-8,
// intermediate 768, bf16 weights and activations, fp32 accumulation), M tokens in, routed output
// out: router (split-bf16 tensor cores) -> routing (softmax top-8, renorm) -> plan -> fused
// gate+up GEMM with SwiGLU -> down GEMM to slot rows -> slot-order combine. Random router and
// inputs (uniform-ish routing), L2 flushed before every replay, the layer as one CUDA graph,
// median of the replays. Also each stage alone (its own graph), to show where the time goes.
//
//   gpu_moe_bench [--out FILE.tsv] [--iters N] [--m 1,8,64,...]
//
// Printed, never asserted. Ceilings for the floor: 4.3 TB/s and 790 TFLOP/s (KINDS.md, measured
// on an H200 of this workplace); the copy ceiling is re-measured here and printed beside them.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

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
};

DeviceArray<unsigned char> g_flush;
constexpr size_t kFlushBytes = size_t(512) << 20;

template <class F>
cudaGraphExec_t capture(F&& f) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  EPMOE_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
  f();
  EPMOE_CUDA_CHECK(cudaStreamEndCapture(stream(), &g));
  EPMOE_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  EPMOE_CUDA_CHECK(cudaGraphDestroy(g));
  return ge;
}

// Median microseconds of `iters` replays, each after an L2 flush (a 512 MB memset).
double time_graph(cudaGraphExec_t ge, int iters, bool flush = true) {
  cudaEvent_t a, b;
  EPMOE_CUDA_CHECK(cudaEventCreate(&a));
  EPMOE_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> us;
  for (int i = 0; i < iters + 3; i++) {
    if (flush) EPMOE_CUDA_CHECK(cudaMemsetAsync(g_flush.data(), i & 0xff, kFlushBytes, stream()));
    EPMOE_CUDA_CHECK(cudaEventRecord(a, stream()));
    EPMOE_CUDA_CHECK(cudaGraphLaunch(ge, stream()));
    EPMOE_CUDA_CHECK(cudaEventRecord(b, stream()));
    EPMOE_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    EPMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) us.push_back(ms * 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(us.begin(), us.end());
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

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  int iters = 30;
  std::vector<int> Ms = {1, 8, 64, 256, 1024, 4096};
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) out = argv[++i];
    else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
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
  try {
    init_device(0);
    g_flush.reserve(kFlushBytes);
    const double bw = copy_bandwidth(), bwk = copy_kernel_bandwidth();
    std::printf("device-to-device copy: cudaMemcpy %.2f TB/s, 16-byte copy kernel %.2f TB/s (read + write); "
                "ceilings used: %.1f TB/s, %.0f TFLOP/s\n", bw / 1e12, bwk / 1e12, kBw / 1e12, kFlops / 1e12);
    Bench b;
    FILE* f = out.empty() ? nullptr : std::fopen(out.c_str(), "w");
    if (f)
      std::fprintf(f, "M\tus\tbytes\tflops\tfloor_us\tratio\tdistinct\trouter_us\troute_us\tplan_us\tgemm1_us\tgemm2_us\tcombine_us\tdeterministic\n");
    std::printf("\n| M | us | distinct experts | bytes | FLOPs | floor us | / floor | router | route | plan | gate+up | down | combine |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
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
      cudaGraphExecDestroy(ge);
      std::printf("| %d | %.1f | %zu | %.3g | %.3g | %.1f | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |%s\n", M, us,
                  distinct.size(), bytes, flops, floor_us, us / floor_us, st[0], st[1], st[2], st[3], st[4], st[5],
                  same ? "" : " NOT DETERMINISTIC/FINITE");
      if (f)
        std::fprintf(f, "%d\t%.2f\t%.6g\t%.6g\t%.2f\t%.3f\t%zu\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%d\n", M, us, bytes,
                     flops, floor_us, us / floor_us, distinct.size(), st[0], st[1], st[2], st[3], st[4], st[5], same);
    }
    if (f) std::fclose(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_moe_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
