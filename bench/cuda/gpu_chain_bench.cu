// What one kernel costs on a decode step's chain of dependent kernels, apart from its work: N
// kernels launched back to back with launch_pdl (common.cuh) and replayed as one CUDA graph, each
// waiting for the one before (pdl_wait), reading one word the one before wrote and writing the next
// -- the smallest kernel the chain can hold. Per grid shape (1 CTA; one CTA per SM; three per SM, as
// the expert GEMMs at one token) and thread count, us per kernel, median over graph replays; then
// the same with a dependent L2 read and a __syncthreads reduction after the wait, the work of a
// norm or a routing kernel. Printed, never asserted (issue 33: where a one-sequence step's time goes
// between the weight streams).
//   gpu_chain_bench [--kernels N (480)] [--replays N (20)]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "graph_timing.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/common.cuh"

using namespace epmoe;
using namespace epmoe::cuda;

namespace {

// The chain's link: wait, read the word the kernel before wrote, write it + 1 (CTA 0's thread 0).
// work: also a block-wide sum over 2 KB read from L2 (a norm's or a routing kernel's shape).
__global__ void link_kernel(const unsigned* in, unsigned* out, const float* row, float* sink, int work) {
  pdl_wait();
  pdl_trigger();
  __shared__ float part[32];
  unsigned v = 0;
  if (blockIdx.x == 0 && threadIdx.x == 0) v = *in;
  if (work) {
    float s = 0.f;
    for (int i = threadIdx.x; i < 512; i += blockDim.x) s += row[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      float t = 0.f;
      for (int w = 0; w < int(blockDim.x >> 5); w++) t += part[w];
      if (t == 1234.5f) *sink = t;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *out = v + 1;
}

}  // namespace

int main(int argc, char** argv) {
  int kernels = 480, replays = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--kernels") kernels = std::atoi(argv[i + 1]);
    else if (k == "--replays") replays = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s (flags: --kernels, --replays)\n", k.c_str());
      return 2;
    }
  }
  init_device(0);
  const int sms = sm_count();
  DeviceArray<unsigned> words(size_t(kernels) + 1);
  DeviceArray<float> row(512), sink(1);
  EPMOE_CUDA_CHECK(cudaMemset(row.data(), 0, sizeof(float) * 512));
  std::printf("%d SMs, %d kernels a graph, PDL %s; us per kernel, median (worst) of %d replays\n\n", sms, kernels,
              pdl_enabled() ? "on" : "off", replays);
  std::printf("| CTAs | threads | work after the wait | us per kernel |\n|---|---|---|---|\n");
  for (int work : {0, 1})
    for (auto [ctas, threads] : {std::pair{1, 128}, std::pair{1, 1024}, std::pair{sms, 128}, std::pair{3 * sms, 64}}) {
      const cudaGraphExec_t ge = bench::capture([&] {
        for (int k = 0; k < kernels; k++)
          launch_pdl(link_kernel, dim3(unsigned(ctas)), dim3(unsigned(threads)), 0, stream(),
                     static_cast<const unsigned*>(words.data() + k), words.data() + k + 1,
                     static_cast<const float*>(row.data()), sink.data(), work);
      });
      // (Each replay from zeroed words: the last one then says whether the chain saw every write.)
      const auto us = bench::replay_us(ge, replays, 2, [&](int) {
        EPMOE_CUDA_CHECK(cudaMemsetAsync(words.data(), 0, sizeof(unsigned) * (size_t(kernels) + 1), stream()));
      });
      const unsigned last = words.download(size_t(kernels) + 1)[size_t(kernels)];
      std::printf("| %d | %d | %s | %.2f (%.2f)%s |\n", ctas, threads, work ? "2 KB L2 read + block sum" : "one word",
                  us[us.size() / 2] / kernels, us.back() / kernels, last == unsigned(kernels) ? "" : " (chain broken)");
      EPMOE_CUDA_CHECK(cudaGraphExecDestroy(ge));
    }
  return 0;
}
