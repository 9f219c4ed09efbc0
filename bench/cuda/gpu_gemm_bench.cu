// The dense projections of a Qwen3-30B-A3B decode step on one GPU, each kernel path side by side:
// split_linear (bf16 mode's fp32-grade products of bf16 weights: [xh | xl] against the weights
// read once) at T = 1, 8 and 16 rows for q/k/v (5120 x 2048), o (2048 x 4096) and the lm_head
// (151936 x 2048), split_rows then the GEMM on the mma.sync tile kernel and on the wgmma kernel,
// and split_gemv (the split fused: v4's shared-memory ring chosen per weight, at each ring size x
// warps, and v3's register prefetch) -- all the same bits. Calls timed 16 at a time between two
// events (each on other weights, rotated over copies larger than L2: none cached from the call
// before), median over --iters batches; GB/s of weight bytes, and the share of the HBM read rate
// this bench measures first. Printed, never asserted.
//   gpu_gemm_bench [--iters N (50)] [--rows LIST (1,8,16)] [--shapes LIST (q/k/v,o,lm_head)]
// (--shapes o --rows 1: one shape's kernels alone, e.g. under Nsight Compute)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/split_linear.cuh"

using namespace epmoe;
using namespace epmoe::cuda;

namespace {

__global__ void read_kernel(const uint4* __restrict__ p, size_t n, float* sink) {
  uint32_t acc = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = 1.f;
}

// HBM read rate: best of 5 reads of 4 GiB.
double read_bandwidth() {
  const size_t bytes = size_t(4) << 30;
  DeviceArray<unsigned char> buf(bytes);
  DeviceArray<float> sink(1);
  EPMOE_CUDA_CHECK(cudaMemset(buf.data(), 1, bytes));
  cudaEvent_t a, b;
  EPMOE_CUDA_CHECK(cudaEventCreate(&a));
  EPMOE_CUDA_CHECK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int i = 0; i < 5; i++) {
    EPMOE_CUDA_CHECK(cudaEventRecord(a, stream()));
    read_kernel<<<sm_count() * 8, 512, 0, stream()>>>(reinterpret_cast<const uint4*>(buf.data()), bytes / 16,
                                                     sink.data());
    EPMOE_CUDA_CHECK(cudaEventRecord(b, stream()));
    EPMOE_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    EPMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms);
  }
  return double(bytes) / (best * 1e-3);
}

// One warp's chain of dependent mma.sync m16n8k16 bf16 steps (the chain every output of the
// split projections is): cycles per step, from the SM clock.
__global__ void mma_chain_kernel(int n, float* sink, long long* cycles) {
  uint32_t a[4] = {1u, 3u, 5u, 7u};
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  const long long t0 = clock64();
  for (int i = 0; i < n; i++) ptx::mma_bf16(d, a, uint32_t(i), uint32_t(i) ^ 0x5555u);
  const long long t1 = clock64();
  sink[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
  if (threadIdx.x == 0) *cycles = t1 - t0;
}

double mma_chain_cycles() {
  DeviceArray<float> sink(32);
  DeviceArray<long long> cycles(1);
  const int n = 4096;
  for (int rep = 0; rep < 2; rep++) mma_chain_kernel<<<1, 32, 0, stream()>>>(n, sink.data(), cycles.data());
  EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  return double(cycles.download(1)[0]) / n;
}

struct Shape {
  const char* name;
  int N, K;
};

}  // namespace

int main(int argc, char** argv) {
  int iters = 50;
  std::vector<int> rows = {1, 8, 16};
  std::string shapes_wanted = "q/k/v,o,lm_head";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--iters") iters = std::max(1, std::atoi(argv[i + 1]));
    else if (k == "--rows") {
      rows.clear();
      for (std::string s = argv[i + 1]; !s.empty();) {
        const size_t q = s.find(',');
        rows.push_back(std::stoi(s.substr(0, q)));
        s = q == std::string::npos ? "" : s.substr(q + 1);
      }
    } else if (k == "--shapes") {
      shapes_wanted = argv[i + 1];
    } else {
      std::fprintf(stderr, "gpu_gemm_bench: unknown flag %s (--iters, --rows, --shapes)\n", k.c_str());
      return 2;
    }
  }
  try {
    const double bw = read_bandwidth();
    std::printf("HBM read %.0f GB/s; one dependent mma.sync m16n8k16 bf16 step: %.1f cycles\n\n", bw / 1e9,
                mma_chain_cycles());
    // split_gemv's choices (version, depth, warps, ring, chunk); the first is the default: v6 (bulk
    // copies of `chunk` blocks) chosen per weight and at other rings, chunks and warps, v5 chosen per
    // weight and at other rings x warps, v4 chosen per weight and at one ring, v3 (registers).
    const std::tuple<int, int, int, int, int> gemv_cfgs[] = {
        {6, 8, 1, -1, 4}, {6, 8, 1, 16, 4}, {6, 8, 1, 16, 8}, {6, 8, 1, 32, 4}, {6, 8, 2, 16, 4},
        {5, 8, 1, -1, 4}, {5, 8, 1, 8, 4},  {5, 8, 1, 16, 4}, {5, 8, 2, 16, 4}, {4, 8, 1, -1, 4},
        {4, 8, 4, 32, 4}, {3, 8, 4, 0, 4}};
    std::printf("| projection | N x K | rows | tile kernel us (GB/s) | wgmma kernel us (GB/s) | split_gemv us (GB/s) | "
                "gemv / tile | best of HBM | split_gemv variants: us |\n"
                "|---|---|---|---|---|---|---|---|---|\n");
    const Shape shapes[] = {{"q/k/v", 5120, 2048}, {"o", 2048, 4096}, {"lm_head", 151936, 2048}};
    cudaEvent_t e0, e1;
    EPMOE_CUDA_CHECK(cudaEventCreate(&e0));
    EPMOE_CUDA_CHECK(cudaEventCreate(&e1));
    const SplitGemvConfig saved = split_gemv_config();
    for (const Shape& sh : shapes) {
      if (("," + shapes_wanted + ",").find("," + std::string(sh.name) + ",") == std::string::npos) continue;
      const double wbytes = double(sh.N) * sh.K * 2;
      const int copies = std::max(1, int(200e6 / wbytes + 1));  // > 200 MB in rotation: never in L2
      std::vector<SplitWeight> ws(static_cast<size_t>(copies));
      for (int c = 0; c < copies; c++) {
        ws[size_t(c)].init_random(sh.N, sh.K, 100 + c, 0.02f, stream());
        ws[size_t(c)].pack_fragments(stream(), true);
      }
      DeviceArray<float> x(size_t(16) * sh.K), y(size_t(16) * sh.N);
      DeviceArray<bf16> xs;
      fill_random(x.data(), int64_t(16) * sh.K, 7, 1.0f, stream());
      for (int T : rows) {
        auto time = [&](auto&& call) {
          for (int i = 0; i < 3; i++) call(i);
          std::vector<float> t;
          // kBatch calls between the events (each on other weights): a call's time is then what it
          // takes among its neighbours, as in a decode step, not ~10 us of event overhead each.
          constexpr int kBatch = 16;
          for (int i = 0; i < iters; i++) {
            EPMOE_CUDA_CHECK(cudaEventRecord(e0, stream()));
            for (int b = 0; b < kBatch; b++) call(i * kBatch + b);
            EPMOE_CUDA_CHECK(cudaEventRecord(e1, stream()));
            EPMOE_CUDA_CHECK(cudaEventSynchronize(e1));
            float ms = 0;
            EPMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            t.push_back(ms * 1e3f / kBatch);
          }
          std::sort(t.begin(), t.end());
          return double(t[t.size() / 2]);
        };
        double us[2] = {0, 0};
        for (int path = 0; path < 2; path++)
          us[path] = time([&](int i) {
            const SplitWeight& w = ws[size_t(i % copies)];
            split_rows(x.data(), sh.K, T, sh.K, 2, xs, stream(), true);  // split_linear's A
            GemmArgs g;
            g.A = xs.data();
            g.lda = 2 * sh.K;
            g.B = w.w.data();
            g.ldb = sh.K;
            g.b_k_twice = true;
            g.M = T;
            g.N = sh.N;
            g.K = 2 * sh.K;
            g.C = y.data();
            g.ldc = sh.N;
            g.path = path == 0 ? GemmPath::Tiled : GemmPath::Wgmma;
            gemm<bf16, float>(g, Epilogue::Store, stream());
          });
        std::string cfg_cells;
        double gemv_us = 0;
        if (T <= kSplitGemvMaxRows)
          for (auto [version, depth, warps, ring, chunk] : gemv_cfgs) {
            set_split_gemv_config({true, depth, warps, ring, version, chunk});
            const double u = time([&](int i) {
              split_gemv(ws[size_t(i % copies)], x.data(), sh.K, T, y.data(), nullptr, Epilogue::Store, stream());
            });
            if (gemv_us == 0) gemv_us = u;
            char cell[64];
            if (version >= 6)
              std::snprintf(cell, sizeof cell, "%sv6 ring %s/%d x %d: %.1f", cfg_cells.empty() ? "" : ", ",
                            ring < 0 ? "auto" : std::to_string(ring).c_str(), chunk, warps, u);
            else if (version >= 4)
              std::snprintf(cell, sizeof cell, "%sv%d ring %s x %d: %.1f", cfg_cells.empty() ? "" : ", ", version,
                            ring < 0 ? "auto" : std::to_string(ring).c_str(), warps, u);
            else
              std::snprintf(cell, sizeof cell, "%sv3 %dx%d: %.1f", cfg_cells.empty() ? "" : ", ", depth, warps, u);
            cfg_cells += cell;
          }
        set_split_gemv_config(saved);
        const double best = std::min({us[0], us[1], gemv_us > 0 ? gemv_us : 1e30});
        std::printf("| %s | %d x %d | %d | %.1f (%.0f) | %.1f (%.0f) | %.1f (%.0f) | %.2f | %.2f | %s |\n", sh.name, sh.N,
                    sh.K, T, us[0], wbytes / (us[0] * 1e3), us[1], wbytes / (us[1] * 1e3), gemv_us,
                    gemv_us > 0 ? wbytes / (gemv_us * 1e3) : 0.0, gemv_us / us[0], wbytes / (best * 1e-6) / bw,
                    cfg_cells.c_str());
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_gemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
