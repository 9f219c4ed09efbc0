// The expert side of the MoE layer on the GPU, twin of moe/experts.cc and moe/moe_layer.cc: the
// weights of this rank's physical experts, the runners a backend calls (plan -> fused gate+up GEMM
// with SwiGLU -> down GEMM scattered to the output rows), and the layer's output (routed + gated
// shared expert). The runners implement ep/backend.h's ExpertRunner on Device::Cuda.
#pragma once

#include <vector>

#include "ep/backend.h"
#include "ep/cuda/expert_plan.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemm_fp8.cuh"
#include "kernels/cuda/split_linear.cuh"
#include "tensor/view.h"

namespace epmoe::cuda {

int planless_jobs_default();   // EPMOE_PLANLESS_JOBS (experts.cu)
bool fused_combine_default();  // EPMOE_FUSED_COMBINE (experts.cu)

template <class T>
struct ExpertWeightsGpu {
  int H = 0, I = 0;
  int p0 = 0, n_local = 0;  // physical experts [p0, p0 + n_local) of this rank
  DeviceArray<T> w1;        // [n_local][2I][H], gate row j at 2j, up row j at 2j + 1
  DeviceArray<T> w2;        // [n_local][H][I]
};

// The experts of a checkpoint on its own activation type T (bf16 rows of a bf16 checkpoint under
// --compute bf16; fp32 rows under --compute f32).
template <class T>
class ExpertRunnerGpu final : public ExpertRunner {
 public:
  explicit ExpertRunnerGpu(const ExpertWeightsGpu<T>& w) : w_(w) {}
  Device device() const override { return Device::Cuda; }
  void run(const ExpertJobs& j, void* out) override;
  // For tests and benchmarks: the per-expert offsets of the last plan.
  const int32_t* offsets() const { return plan_.offsets.data(); }
  // Up to this many (token, slot) jobs of a token_jobs set (bf16) run without a plan: each job is a
  // group of one row whose weights the GEMM picks from its expert id (GemmArgs::job_expert), so a
  // decode step's chain loses the plan kernel. 0: always plan. Default EPMOE_PLANLESS_JOBS (16).
  void set_planless_jobs(int64_t n) { planless_jobs_ = n; }
  // Planless jobs fold the backend's combine into the down GEMM (GemmArgs::row_sum_out): one
  // kernel fewer on a decode step's chain. Default EPMOE_FUSED_COMBINE (1).
  bool run_and_combine(const ExpertJobs& j, void* out, const float* w, float* y) override;
  void set_fused_combine(bool on) { fused_combine_ = on; }

 private:
  bool planless(const ExpertJobs& j) const;
  void run_jobs(const ExpertJobs& j, void* out, const float* w = nullptr, float* y = nullptr);
  // The gate+up and down GEMMs over the runner's weights; g1 and g2 bring the grouping (a plan's or
  // jobs') and, for g2, the row sums.
  void run_gemms(GemmArgs g1, GemmArgs g2, const ExpertJobs& j, void* out);
  const ExpertWeightsGpu<T>& w_;
  int64_t planless_jobs_ = planless_jobs_default();
  bool fused_combine_ = fused_combine_default();
  DeviceArray<int32_t> row_sum_counters_;  // zero between launches (GemmArgs::row_sum_counters)
  ExpertPlanGpu plan_;
  DeviceArray<T> h_;
};

// The routed experts of a checkpoint stored in fp32 under --compute bf16: rounding their weights
// to bf16 makes another model (measured on the CPU: expert weights alone rounded move a
// log-probability by 0.37 on mixtral-tiny, where an expert choice flips at a near-tie), so they
// keep fp32 accuracy on the tensor cores as split_linear does (P = 3): rows arrive in fp32, are
// split into [xh | xh | xl], the fused gate+up GEMM runs over K' = 3H against [wh | wl | wh], h
// stays fp32 and is split again for the down GEMM over 3I. Outputs are fp32 rows.
class SplitExpertRunner final : public ExpertRunner {
 public:
  int H = 0, I = 0, p0 = 0, n_local = 0;
  DeviceArray<bf16> w1;  // [n_local][2I][3H] (gate row j at 2j, up row j at 2j + 1)
  DeviceArray<bf16> w2;  // [n_local][H][3I]

  // Expert q's gate/up rows interleaved [2I, H] and down [H, I], fp32.
  void upload(int q, const std::vector<float>& gate_up, const std::vector<float>& down);
  void reserve() {
    w1.reserve(size_t(n_local) * size_t(2 * I) * 3 * size_t(H));
    w2.reserve(size_t(n_local) * size_t(H) * 3 * size_t(I));
  }

  Device device() const override { return Device::Cuda; }
  void run(const ExpertJobs& j, void* out) override;

 private:
  ExpertPlanGpu plan_;
  DeviceArray<float> h_;
  DeviceArray<bf16> xs_, hs_;
};

// The routed experts of an FP8 block-quantized checkpoint kept in fp8 on the device and computed on
// the fp8 tensor cores (kernels/cuda/gemm_fp8.cuh; the opt-in GpuFp8Compute::TensorCore of
// model/cuda/gpu_model.h): the checkpoint's e4m3 codes, one byte per weight, rows zero-padded to
// whole 128-blocks, with their block scales expanded to one fp32 per (row, k block) -- about 3 % of
// the codes' bytes -- so that gate and up rows interleave as in the other runners. A run quantizes
// the source rows per token and 128-channel group, runs the fused gate+up GEMM with SwiGLU (h in
// fp32), quantizes h the same way, and runs the down GEMM scattered to the output rows. Rows
// arrive and leave in fp32. Not the dequantized weights' product: activations are rounded to e4m3
// (3 significand bits), which the goldens of the FP8 fixtures do not model (docs/gpu.md).
class Fp8ExpertRunner final : public ExpertRunner {
 public:
  int H = 0, I = 0, Hp = 0, Ip = 0, p0 = 0, n_local = 0;  // Hp, Ip: H and I padded to 128
  DeviceArray<uint8_t> w1;  // [n_local][2I][Hp] e4m3, gate row j at 2j, up row j at 2j + 1
  DeviceArray<float> s1;    // [n_local][Hp / 128][2I]: the scale of row n's k block b at [b][n]
  DeviceArray<uint8_t> w2;  // [n_local][H][Ip]
  DeviceArray<float> s2;    // [n_local][Ip / 128][H]

  // Shapes and allocation (weights uninitialised: upload each expert, or fill them for benchmarks).
  void init(int H_, int I_, int p0_, int n_local_);
  // Expert q from a checkpoint's F8_E4M3 views with their block scales: gate, up [I, H], down [H, I].
  void upload(int q, const TensorView& gate, const TensorView& up, const TensorView& down);
  // Device bytes of the weights and scales of one expert.
  size_t expert_bytes() const;
  // Whether gate, up and down can be uploaded: F8_E4M3 with a scale grid of 128-blocks.
  static bool accepts(const TensorView& t);

  Device device() const override { return Device::Cuda; }
  void run(const ExpertJobs& j, void* out) override;
  const int32_t* offsets() const { return plan_.offsets.data(); }

 private:
  ExpertPlanGpu plan_;
  DeviceArray<uint8_t> xq_, hq_;
  DeviceArray<float> xs_, hs_, h_;
};

// moe/moe_layer.cc after the backend: v = routed + sigmoid(gate) * shared (gate nullptr: 1;
// shared nullptr: v = routed); out = accumulate ? out + v : v.
void moe_output(const float* routed, const float* shared, const float* gate_logit, int64_t T, int H, float* out,
                bool accumulate, cudaStream_t s);

}  // namespace epmoe::cuda
