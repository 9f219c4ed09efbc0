// The contract of every all-to-all backend (ARCHITECTURE.md, "Data flow"):
//
//   run(tokens of this rank, expert callable) -> y[T, H], the FINAL routed output of this rank's
//   tokens: sum_k w_k * expert_k(x), reduced exactly once.
//
// A backend owns dispatch -> expert compute -> combine. Nothing outside src/ep/ knows which
// backend runs, and nothing outside it reduces across ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ep/placement.h"

namespace epmoe {

class Communicator;

// The expert computation, declared here so that ep/ never depends on moe/: rows in, rows out, for
// one physical expert this rank owns. Must be batch-invariant: a row's result depends only on
// that row (not on n, nor on which other rows come with it).
using ExpertFn = std::function<void(int physical_expert, const float* in, int64_t n, float* out)>;

struct MoeTokens {
  int64_t T = 0;                  // this rank's tokens (may be 0: the rank still joins the layer)
  int H = 0;
  int K = 0;
  const float* x = nullptr;       // [T, H]
  const int32_t* physical = nullptr;  // [T, K] physical expert of each slot (replica chosen)
  const float* weights = nullptr;     // [T, K] top-k weights, fp32
};

enum class CombineMode {
  Deterministic,  // one row per (token, slot) returns home, summed in slot order: bit-identical
  Fast,           // each rank sums its own slots per token; home adds per-rank partials
};

class A2ABackend {
 public:
  virtual ~A2ABackend() = default;
  virtual std::string name() const = 0;
  // y: [T, H], overwritten.
  virtual void run(const MoeTokens& in, const ExpertFn& expert, float* y) = 0;
};

struct BackendOptions {
  CombineMode combine = CombineMode::Deterministic;
  int max_dispatch_tokens_per_rank = 128;  // bounded-capacity backends
  int chunk_tokens = 64;                   // pipelined backend
};

// Names accepted by --moe-a2a-backend, in the order `check --moe-a2a-backend all` runs them.
std::vector<std::string> backend_names();
// Creates a backend by name; throws InputError listing the valid names for an unknown one.
std::unique_ptr<A2ABackend> make_backend(const std::string& name, Communicator& comm,
                                         const Placement& placement, const BackendOptions& opt);
// The single-process reference: every expert local, no communication (used by `check` and R = 1).
std::unique_ptr<A2ABackend> make_local_backend(const Placement& placement);

}  // namespace epmoe
