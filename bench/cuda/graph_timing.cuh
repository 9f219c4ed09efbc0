// CUDA-graph timing for the GPU benchmarks: capture enqueued work as a graph on the process's
// stream, replay it between two events. Printed figures only, never asserted.
#pragma once

#include <algorithm>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace epmoe::cuda::bench {

// f() enqueued on stream() as one instantiated graph.
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

// Microseconds of `iters` replays of ge, sorted (median at size / 2, worst at back()), after
// `warmup` untimed ones; before(i) is enqueued ahead of replay i, outside the timed span (an L2
// flush, a reset of what the graph reads).
template <class Before>
std::vector<double> replay_us(cudaGraphExec_t ge, int iters, int warmup, Before&& before) {
  cudaEvent_t a, b;
  EPMOE_CUDA_CHECK(cudaEventCreate(&a));
  EPMOE_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> us;
  for (int i = 0; i < iters + warmup; i++) {
    before(i);
    EPMOE_CUDA_CHECK(cudaEventRecord(a, stream()));
    EPMOE_CUDA_CHECK(cudaGraphLaunch(ge, stream()));
    EPMOE_CUDA_CHECK(cudaEventRecord(b, stream()));
    EPMOE_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    EPMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (i >= warmup) us.push_back(ms * 1e3);
  }
  EPMOE_CUDA_CHECK(cudaEventDestroy(a));
  EPMOE_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(us.begin(), us.end());
  return us;
}

}  // namespace epmoe::cuda::bench
