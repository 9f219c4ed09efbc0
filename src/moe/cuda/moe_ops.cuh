// The GPU's phases of the one MoE block (moe/moe_block.h orders them; the CPU's are in
// moe/moe_layer.cc). Each phase only enqueues kernels on the stream, so a decode step's CUDA graph
// captures the whole block. The decoder (model/cuda/gpu_model.cu) hands over the layer's router,
// experts and shared-expert weights and its scratch, and gets back the block's output as a
// MoeResidual, which it adds into the residual stream (here or fused into the next layer's norm).
#pragma once

#include "ep/backend.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/ops.cuh"
#include "moe/cuda/routing.cuh"

namespace epmoe::cuda {

// SharedSwiglu: void(float* out), the shared expert's SwiGLU on the step's rows into out [T, H]
// fp32 (the decoder's dense SwiGLU: its weights and GEMM path are the decoder's). A template
// parameter, not a std::function: the block is built per layer per step.
template <class SharedSwiglu>
struct GpuMoeOps {
  GpuMoeOps(RouterGpu& r, ExpertRunner& e, SharedSwiglu fn) : router(r), runner(e), shared_swiglu(fn) {}
  // The layer.
  RouterGpu& router;
  ExpertRunner& runner;
  const float* shared_gate = nullptr;  // [1, H] (Qwen2-MoE) or nullptr
  bool has_shared = false;             // the family has a shared expert
  SharedSwiglu shared_swiglu;
  // The step.
  RouteArgs ra;             // the layer's slices of the routing arrays, the replicas (physical), the gids
  bool replay = false;      // ra.logical / ra.weights hold a given routing (routing replay)
  int64_t T = 0;
  int H = 0, K = 0;
  const float* x_f32 = nullptr;  // [T, H] the normalised rows in fp32 (router, gate)
  const void* rows = nullptr;    // the rows the experts read, of type act
  DType act = DType::F32;
  float* routed_out = nullptr;   // [T, H] the backend's output
  float* shared_out = nullptr;   // [T, H]
  float* gate_out = nullptr;     // [T]
  cudaStream_t s = nullptr;
  MoeResidual result;            // output(): what the decoder adds into x

  bool replaying() const { return replay; }
  void replayed_route() { replica_slots(ra, s); }
  RouterGpu::Logits lg{};
  // A decode step's routing is enqueued with its logits (RouterGpu::routes: the router's last CTA
  // routes, one kernel fewer on the step's chain); route() then has nothing left to enqueue.
  bool routed_with_logits = false;
  void router_logits() {
    routed_with_logits = router.routes(ra, T);
    if (routed_with_logits) router.run_and_route(x_f32, T, ra, s);
    else lg = router.run(x_f32, T, s);
  }
  void route() {
    if (routed_with_logits) return;
    ra.logits = lg.ptr;
    ra.parts = lg.parts;
    ra.part_stride = lg.stride;
    cuda::route(ra, s);
  }
  MoeTokens tokens() const {
    MoeTokens tok;
    tok.device = Device::Cuda;
    tok.act = act;
    tok.T = T;
    tok.H = H;
    tok.K = K;
    tok.x = rows;
    tok.physical = ra.physical;
    tok.weights = ra.weights;
    return tok;
  }
  ExpertRunner& experts() { return runner; }
  float* routed() { return routed_out; }
  bool has_shared_expert() const { return has_shared && T > 0; }
  void shared_expert() {
    shared_swiglu(shared_out);
    result.shared = shared_out;
    if (!shared_gate) return;
    GemmArgs g;
    g.A = x_f32;
    g.lda = H;
    g.B = shared_gate;
    g.ldb = H;
    g.M = int(T);
    g.N = 1;
    g.K = H;
    g.C = gate_out;
    g.ldc = 1;
    gemm<float, float>(g, Epilogue::Store, s);
    result.gate_logit = gate_out;
  }
  void output() { result.routed = routed_out; }
};

}  // namespace epmoe::cuda
