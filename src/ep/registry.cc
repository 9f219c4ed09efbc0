// The registry of all-to-all backends: the only place that maps a (name, device) pair to code.
#include <algorithm>

#include "comm/mpi_group.h"
#include "ep/backend.h"
#include "ep/cpu_local_backend.h"
#include "ep/mpi/mpi_backends.h"
#include "ep/traits.h"
#include "util/error.h"
#ifdef EPMOE_HAVE_CUDA
#include "comm/nccl_group.h"
#include "ep/nccl/nccl_backends.h"
#endif

namespace epmoe {

namespace {

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::vector<std::string> devices_of(const BackendTraits& t) {
  std::vector<std::string> out;
  for (Device d : all_devices())
    if (supports(t, d)) out.emplace_back(device_name(d));
  return out;
}

// Options a backend does not implement on a device, refused before any work (exit 2, naming the
// backend, the device and what does implement it). kind: nullptr for the single-process path.
void check_options_on(Device device, const BackendKind* kind, const BackendOptions& o) {
  switch (device) {
    case Device::Cpu: return;
    case Device::Cuda:
      if (o.combine == CombineMode::Fast && kind) switch (*kind) {
          case BackendKind::AllToAll:
          case BackendKind::OneSided: break;
          case BackendKind::None:
          case BackendKind::LowLatency:
          case BackendKind::Fused:
            throw InputError("--combine fast with --moe-a2a-backend " + std::string(traits_of(*kind).name) +
                             ": on --device cuda the fast combine is implemented by alltoall and onesided (on cpu: "
                             "every backend)");
        }
      return;
  }
}

template <class G>
G& group_as(Group& g, Device device) {
  G* p = dynamic_cast<G*>(&g);
  if (!p)
    throw Error(std::string("backend registry: --device ") + device_name(device) + " needs its own group, got a " +
                g.transport() + " group");
  return *p;
}

}  // namespace

std::vector<std::string> backend_names() {
  std::vector<std::string> out;
  for (BackendKind k : all_backend_kinds()) out.emplace_back(traits_of(k).name);
  return out;
}

std::vector<std::string> backend_names(Device device) {
  std::vector<std::string> out;
  for (BackendKind k : all_backend_kinds())
    if (supports(traits_of(k), device)) out.emplace_back(traits_of(k).name);
  return out;
}

std::unique_ptr<A2ABackend> make_local_backend(Device device, const Placement& placement, const BackendOptions& opt) {
  check_options_on(device, nullptr, opt);
  switch (device) {
    case Device::Cpu: return make_cpu_local_backend(placement, opt);
    case Device::Cuda:
#ifdef EPMOE_HAVE_CUDA
      return make_cuda_local_backend(placement, opt);
#else
      throw InputError("--device cuda: this epmoe was built without CUDA (configure with -DEPMOE_CUDA=ON)");
#endif
  }
  throw Error("make_local_backend: unknown device");
}

std::unique_ptr<A2ABackend> make_backend(const std::string& name, Device device, Group& group,
                                         const Placement& placement, const BackendOptions& opt) {
  const auto kinds = all_backend_kinds();
  auto it = std::find_if(kinds.begin(), kinds.end(), [&](BackendKind k) { return traits_of(k).name == name; });
  if (it == kinds.end())
    throw InputError("--moe-a2a-backend '" + name + "': unknown backend (choose one of " + join(backend_names(), ", ") +
                     ")");
  const BackendTraits t = traits_of(*it);
  if (!supports(t, device))
    throw InputError("--moe-a2a-backend " + name + " is not implemented on --device " + device_name(device) +
                     " (it runs on: " + join(devices_of(t), ", ") + "; on " + device_name(device) + " choose one of " +
                     join(backend_names(device), ", ") + ")");
  check_options_on(device, &t.kind, opt);
  // A group of one has nobody to exchange with: every backend is the local path, which is
  // exactly what each of them computes at R = 1. (Under `mpirun -np 1` the MPI backends run
  // for real, so that their code paths can be tested on one rank.)
  switch (device) {
    case Device::Cpu: {
      MpiGroup& g = group_as<MpiGroup>(group, device);
      if (!g.distributed() && !g.mpi_initialised()) return make_local_backend(device, placement, opt);
      switch (t.kind) {
        case BackendKind::None: return make_mpi_none_backend(g, placement, opt);
        case BackendKind::AllToAll: return make_mpi_alltoall_backend(g, placement, opt);
        case BackendKind::LowLatency: return make_mpi_lowlatency_backend(g, placement, opt);
        case BackendKind::OneSided: return make_mpi_onesided_backend(g, placement, opt);
        case BackendKind::Fused: return make_mpi_fused_backend(g, placement, opt);
      }
      break;
    }
    case Device::Cuda: {
#ifdef EPMOE_HAVE_CUDA
      NcclGroup& g = group_as<NcclGroup>(group, device);
      if (!g.distributed()) return make_local_backend(device, placement, opt);
      switch (t.kind) {
        case BackendKind::None: return make_nccl_none_backend(g, placement, opt);
        case BackendKind::AllToAll: return make_nccl_alltoall_backend(g, placement, opt);
        case BackendKind::LowLatency:
        case BackendKind::OneSided:
        case BackendKind::Fused: return make_ipc_backend(name, g, g.device_peer_fault(), placement, opt);
      }
#endif
      break;
    }
  }
  throw InputError("--moe-a2a-backend " + name + ": no implementation on --device " + device_name(device) +
                   " in this build");
}

}  // namespace epmoe
