// The registry of all-to-all backends: the only place that maps a name to an implementation.
#include <sstream>

#include "comm/communicator.h"
#include "ep/backend.h"
#include "util/error.h"

namespace epmoe {

std::vector<std::string> backend_names() { return {"none", "alltoall", "lowlatency", "onesided", "fused"}; }

std::unique_ptr<A2ABackend> make_backend(const std::string& name, Communicator& comm, const Placement& placement,
                                         const BackendOptions& opt) {
  (void)opt;
  bool known = false;
  for (auto& n : backend_names()) known |= n == name;
  if (!known) {
    std::string all;
    for (auto& n : backend_names()) all += (all.empty() ? "" : ", ") + n;
    throw InputError("--moe-a2a-backend '" + name + "': unknown backend (choose one of " + all + ")");
  }
  if (comm.size() == 1) return make_local_backend(placement);
  throw InputError("--moe-a2a-backend " + name + ": not available yet for more than one rank");
}

}  // namespace epmoe
