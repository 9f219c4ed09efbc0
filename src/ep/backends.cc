// The registry of all-to-all backends: the only place that maps a name to an implementation.
#include "comm/communicator.h"
#include "ep/backends_impl.h"
#include "ep/traits.h"
#include "util/error.h"

namespace epmoe {

namespace {

constexpr BackendKind kAll[] = {BackendKind::None, BackendKind::AllToAll, BackendKind::LowLatency,
                                BackendKind::OneSided, BackendKind::Fused};

}  // namespace

std::vector<std::string> backend_names() {
  std::vector<std::string> out;
  for (BackendKind k : kAll) out.emplace_back(traits_of(k).name);
  return out;
}

std::unique_ptr<A2ABackend> make_backend(const std::string& name, Communicator& comm, const Placement& placement,
                                         const BackendOptions& opt) {
  for (BackendKind k : kAll) {
    if (traits_of(k).name != name) continue;
    // A group of one (no mpirun) has nobody to exchange with: every backend is the local path,
    // which is exactly what each of them computes at R = 1.
    if (!comm.distributed() && !comm.mpi_initialised()) return make_local_backend(placement);
    switch (k) {
      case BackendKind::None: return make_none_backend(comm, placement, opt);
      case BackendKind::AllToAll: return make_alltoall_backend(comm, placement, opt);
      case BackendKind::LowLatency: return make_lowlatency_backend(comm, placement, opt);
      case BackendKind::OneSided: return make_onesided_backend(comm, placement, opt);
      case BackendKind::Fused: return make_fused_backend(comm, placement, opt);
    }
  }
  std::string all;
  for (auto& n : backend_names()) all += (all.empty() ? "" : ", ") + n;
  throw InputError("--moe-a2a-backend '" + name + "': unknown backend (choose one of " + all + ")");
}

}  // namespace epmoe
