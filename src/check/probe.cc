#include "check/probe.h"

#include "check/audit.h"
#include "ep/cpu_expert_jobs.h"
#include "util/error.h"
#ifdef EPMOE_HAVE_CUDA
#include "check/cuda/probe.h"
#endif

namespace epmoe {

namespace {

class CpuProbeRunner final : public ExpertRunner {
 public:
  CpuProbeRunner(const Placement& p, int rank, int H) : p_(p), rank_(rank), H_(H) {}
  Device device() const override { return Device::Cpu; }
  void run(const ExpertJobs& jobs, void* out) override {
    const int H = H_;
    const Placement& p = p_;
    auto probe = [&p, H](int phys, const float* in, int64_t n, float* y) {
      const float scale = audit_probe_scale(p, phys);
      for (int64_t i = 0; i < n * H; i++) y[i] = scale * in[i];
    };
    run_jobs_grouped(jobs, H_, p_.first_local(rank_), p_.num_local(rank_), probe, static_cast<float*>(out));
  }

 private:
  const Placement& p_;
  int rank_, H_;
};

}  // namespace

std::unique_ptr<ExpertRunner> make_probe_runner(Device device, const Placement& p, int rank, int H) {
  switch (device) {
    case Device::Cpu: return std::make_unique<CpuProbeRunner>(p, rank, H);
    case Device::Cuda:
#ifdef EPMOE_HAVE_CUDA
      return make_cuda_probe_runner(p, rank, H);
#else
      throw InputError("--device cuda: this epmoe was built without CUDA");
#endif
  }
  throw Error("make_probe_runner: unknown device");
}

}  // namespace epmoe
