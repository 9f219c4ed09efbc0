// Probe experts on the device: physical expert p multiplies its rows by audit_probe_scale(p).
// They serve exactly the jobs the real runner would (the same plan), so every backend's dispatch,
// answer layout and combine are exercised; only the arithmetic in between is replaced.
#include "check/cuda/probe.h"

#include <algorithm>
#include <vector>

#include "check/audit.h"
#include "ep/cuda/expert_plan.cuh"

namespace epmoe::cuda {

namespace {

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

class ProbeRunner final : public ExpertRunner {
 public:
  ProbeRunner(const Placement& p, int rank, int H) : p0_(p.first_local(rank)), n_(p.num_local(rank)), hidden_(H) {
    std::vector<float> s;
    for (int q = 0; q < n_; q++) s.push_back(audit_probe_scale(p, p0_ + q));
    scale_.upload(s);
  }
  Device device() const override { return Device::Cuda; }
  void run(const ExpertJobs& j, void* out) override {
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

}  // namespace

}  // namespace epmoe::cuda

namespace epmoe {

std::unique_ptr<ExpertRunner> make_cuda_probe_runner(const Placement& placement, int rank, int H) {
  return std::make_unique<cuda::ProbeRunner>(placement, rank, H);
}

}  // namespace epmoe
