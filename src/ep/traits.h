// Backend traits as data, in one place (ARCHITECTURE.md): which devices implement a backend and
// how, read by the registry (to refuse an unsupported pair, naming the devices that support it)
// and by --help. Never by the model: nothing outside src/ep/ may ask which backend runs.
#pragma once

#include <string_view>
#include <vector>

#include "tensor/device.h"

namespace epmoe {

enum class BackendKind { None, AllToAll, LowLatency, OneSided, Fused };

struct BackendTraits {
  BackendKind kind;
  std::string_view name;
  std::string_view cpu;   // the mechanism over MPI, or empty: not implemented on CPUs
  std::string_view cuda;  // the mechanism over NCCL, or empty: not implemented on GPUs
};

BackendTraits traits_of(BackendKind kind);
// Every kind, in the order `check --moe-a2a-backend all` runs them.
std::vector<BackendKind> all_backend_kinds();
// The mechanism on `device`; empty when the backend does not exist there.
std::string_view mechanism_on(const BackendTraits& t, Device device);
inline bool supports(const BackendTraits& t, Device device) { return !mechanism_on(t, device).empty(); }

}  // namespace epmoe
