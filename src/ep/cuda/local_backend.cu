// The single-GPU backend (every expert local, no communication): the reference of the NCCL
// backends. The experts read the token rows in place and write one row per (token, slot); the
// slot-order combine of every GPU backend follows, which is what makes their outputs the same bits
// (a decode step's runner folds it into its down GEMM: ExpertRunner::run_and_combine, the same
// arithmetic).
#include "ep/cuda/plan_combine.cuh"
#include "ep/nccl/nccl_backends.h"

namespace epmoe {

namespace {

using cuda::bf16;
using cuda::DeviceArray;

class CudaLocalBackend final : public A2ABackend {
 public:
  std::string name() const override { return "local"; }
  Device device() const override { return Device::Cuda; }
  bool graph_capturable() const override { return true; }  // kernels only, sizes from the host's T
  void run(const MoeTokens& in, ExpertRunner& experts, float* y) override {
    EPMOE_ASSERT(in.device == Device::Cuda && experts.device() == Device::Cuda,
                 "the cuda local backend runs tokens and experts of the GPU");
    if (in.T == 0) return;
    const bool bf = in.act == DType::BF16;
    const size_t elt = bf ? 2 : 4;
    slots_.reserve(size_t(in.T) * size_t(in.K) * size_t(in.H) * elt);
    if (experts.run_and_combine(token_jobs(in), slots_.data(), in.weights, y)) return;
    experts.run(token_jobs(in), slots_.data());
    if (bf)
      cuda::combine_slots(reinterpret_cast<const bf16*>(slots_.data()), nullptr, in.weights, in.T, in.H, in.K, 1.0f, y,
                          cuda::stream());
    else
      cuda::combine_slots(reinterpret_cast<const float*>(slots_.data()), nullptr, in.weights, in.T, in.H, in.K, 1.0f,
                          y, cuda::stream());
  }

 private:
  DeviceArray<unsigned char> slots_;  // [T * K, H] expert outputs, activation type
};

}  // namespace

std::unique_ptr<A2ABackend> make_cuda_local_backend(const Placement&, const BackendOptions&) {
  return std::make_unique<CudaLocalBackend>();
}

}  // namespace epmoe
