// The process's device and stream, and the single-GPU backend (every expert local).
#include "cuda/moe.cuh"

namespace epmoe::cuda {

namespace {
cudaStream_t g_stream = nullptr;
}

cudaStream_t stream() { return g_stream; }

void init_device(int rank) {
  if (g_stream) return;
  int n = 0;
  EPMOE_CUDA_CHECK(cudaGetDeviceCount(&n));
  if (n == 0) throw InputError("--device cuda: no CUDA device is visible");
  EPMOE_CUDA_CHECK(cudaSetDevice(rank % n));
  // A blocking stream: ordered with the legacy default stream, so that plain cudaMemcpy calls
  // (uploads and downloads of small host vectors) see the work queued before them.
  EPMOE_CUDA_CHECK(cudaStreamCreate(&g_stream));
}

namespace {

class LocalGpuBackend final : public GpuBackend {
 public:
  std::string name() const override { return "local"; }
  void run(const GpuMoeTokens& in, GpuExpertRunner& experts, float* y) override {
    if (in.T == 0) return;
    const size_t elt = in.bf16 ? 2 : 4;
    slots_.reserve(size_t(in.T) * size_t(in.K) * size_t(in.H) * elt);
    GpuExpertJobs j;
    j.x = in.x;
    j.x_stride = in.H;
    j.phys = in.physical;
    j.phys_stride = in.K;
    j.rows = in.T;
    j.K = in.K;
    j.compact = false;
    experts.run(j, slots_.data());
    if (in.bf16)
      combine_slots(reinterpret_cast<const bf16*>(slots_.data()), nullptr, in.weights, in.T, in.H, in.K, 1.0f, y, stream());
    else
      combine_slots(reinterpret_cast<const float*>(slots_.data()), nullptr, in.weights, in.T, in.H, in.K, 1.0f, y, stream());
  }

 private:
  DeviceArray<unsigned char> slots_;  // [T * K, H] expert outputs, activation type
};

}  // namespace

std::unique_ptr<GpuBackend> make_local_gpu_backend(const Placement&) { return std::make_unique<LocalGpuBackend>(); }

}  // namespace epmoe::cuda
