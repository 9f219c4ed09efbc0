// The single-process reference backend on the CPU: every expert is local, nothing is
// communicated. The experts read the token rows in place and write one row per (token, slot); the
// same slot-order combine as the distributed backends follows, which is what makes their outputs
// bit-identical to it.
#include <vector>

#include "ep/combine.h"
#include "ep/cpu_local_backend.h"
#include "util/stage_clock.h"

namespace epmoe {

namespace {

class CpuLocalBackend : public A2ABackend {
 public:
  std::string name() const override { return "local"; }
  Device device() const override { return Device::Cpu; }

  void run(const MoeTokens& in, ExpertRunner& experts, float* y) override {
    slots_.resize(size_t(in.T * in.K) * size_t(in.H));  // reused across layers
    if (in.T > 0) {
      StageScope stage(Stage::Experts);
      experts.run(token_jobs(in), slots_.data());
    }
    StageScope stage(Stage::Combine);
    combine_slots(in.T, in.H, in.K, in.weights, slots_.data(), y);
  }

 private:
  std::vector<float> slots_;  // [T * K, H] expert outputs
};

}  // namespace

std::unique_ptr<A2ABackend> make_cpu_local_backend(const Placement&, const BackendOptions&) {
  return std::make_unique<CpuLocalBackend>();
}

}  // namespace epmoe
