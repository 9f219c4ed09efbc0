// The single-process reference backend: every expert is local, nothing is communicated. It goes
// through the same grouping and slot-order combine as the distributed backends, which is what
// makes their outputs bit-identical to it.
#include <vector>

#include "ep/backend.h"
#include "ep/combine.h"
#include "util/error.h"

namespace epmoe {

namespace {

class LocalBackend : public A2ABackend {
 public:
  LocalBackend() = default;
  std::vector<float> xin_, out_;  // reused across layers
  std::string name() const override { return "local"; }

  void run(const MoeTokens& in, const ExpertFn& expert, float* y) override {
    const int64_t rows = in.T * in.K;
    xin_.resize(size_t(rows * in.H));
    out_.resize(size_t(rows * in.H));
    auto& xin = xin_;
    auto& out = out_;
    for (int64_t t = 0; t < in.T; t++)
      for (int k = 0; k < in.K; k++)
        std::copy(in.x + t * in.H, in.x + (t + 1) * in.H, xin.begin() + (t * in.K + k) * in.H);
    run_experts_grouped(rows, in.H, xin.data(), in.physical, expert, out.data());
    combine_slots(in.T, in.H, in.K, in.weights, out.data(), y);
  }
};

}  // namespace

std::unique_ptr<A2ABackend> make_local_backend(const Placement&) {
  return std::make_unique<LocalBackend>();
}

}  // namespace epmoe
