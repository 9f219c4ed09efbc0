// The contract of every all-to-all backend, on every device (ARCHITECTURE.md, "Data flow"):
//
//   run(tokens of this rank, expert runner) -> y[T, H], the FINAL routed output of this rank's
//   tokens: sum_k w_k * expert_k(x), reduced exactly once.
//
// A backend owns dispatch -> expert compute -> combine. Nothing outside src/ep/ knows which
// backend runs, and nothing outside it reduces across ranks. The same contract serves CPUs (MPI
// backends, host pointers) and GPUs (NCCL backends, device pointers of the process's stream):
// MoeTokens says where its pointers live; the registry (ep/registry.cc) refuses a backend on a
// device it does not support, naming the devices that do.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ep/fault.h"
#include "ep/placement.h"
#include "tensor/device.h"
#include "tensor/dtype.h"

namespace epmoe {

class Group;

struct MoeTokens {
  Device device = Device::Cpu;  // where x, physical, weights and y live
  DType act = DType::F32;       // element type of x and of the expert output rows (BF16: GPUs only)
  int64_t T = 0;                // this rank's tokens (may be 0: the rank still joins the layer)
  int H = 0;
  int K = 0;
  const void* x = nullptr;            // [T, H]
  const int32_t* physical = nullptr;  // [T, K] physical expert of each slot (replica chosen)
  const float* weights = nullptr;     // [T, K] top-k weights, fp32
};

// The work a backend hands to the expert side: source rows, each with K physical expert ids
// (ids this rank does not own, and -1, are skipped). Row r is at x + r * x_stride elements, its
// ids at phys + r * phys_stride. Rows are read where they lie (a token row, a received record):
// no copy into per-expert buffers is asked of the backend. One output row of H elements (the
// activation type) per served (row, slot) job:
//   default      at row * K + k (the home rank's slot rows)
//   compact      at the job's index among the served jobs in (row, slot) order (the order answers
//                travel back in); row_base, when given, receives each row's first index and, at
//                [rows], the total
//   one_per_row  at row (each row has at most one served slot)
struct ExpertJobs {
  const void* x = nullptr;
  int64_t x_stride = 0;
  const int32_t* phys = nullptr;
  int64_t phys_stride = 0;
  int64_t rows = 0;                   // bound known on the host
  const int32_t* rows_dev = nullptr;  // GPUs: the actual count on the device (bounded rounds), or nullptr
  int K = 0;
  bool compact = false;
  bool one_per_row = false;
  int32_t* row_base = nullptr;
};

// The jobs of this rank's own tokens, read in place, one output row per (token, slot) at
// t * K + k: what the single-process path of every device hands its experts.
inline ExpertJobs token_jobs(const MoeTokens& in) {
  ExpertJobs j;
  j.x = in.x;
  j.x_stride = in.H;
  j.phys = in.physical;
  j.phys_stride = in.K;
  j.rows = in.T;
  j.K = in.K;
  return j;
}

// The expert computation, declared here so that ep/ never depends on moe/. Implementations
// (moe/: the model's SwiGLU experts; check/: the audit's probe experts) live on one device and
// must be batch-invariant: a row's result depends only on that row, never on how many rows come
// with it or which.
class ExpertRunner {
 public:
  virtual ~ExpertRunner() = default;
  virtual Device device() const = 0;
  // out: output rows (see ExpertJobs) of H elements of the activation type.
  virtual void run(const ExpertJobs& jobs, void* out) = 0;
  // run() with the single-process backend's slot-order combine folded into the runner's last
  // kernel, for the jobs of token_jobs (one output row per (token, slot), every slot served here):
  // y[t] = sum over k ascending of w[t K + k] * out[t K + k], fp32, each step the combine's own
  // (the same bits as run() and then the backend's combine). False: this runner does not for
  // these jobs, and nothing was enqueued (the backend runs run() and combines itself).
  virtual bool run_and_combine(const ExpertJobs& /*jobs*/, void* /*out*/, const float* /*w*/, float* /*y*/) {
    return false;
  }
};

enum class CombineMode {
  Deterministic,  // one row per (token, slot) returns home, summed in slot order: bit-identical
  Fast,           // each rank sums its own slots per token; home adds per-rank partials
};

class A2ABackend {
 public:
  virtual ~A2ABackend() = default;
  // A number no other backend of the process has had: what caches of work captured with a backend
  // (the GPU model's decode graphs) key on -- an address can come back for a new backend.
  uint64_t uid() const { return uid_; }
  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  // y: [T, H] fp32 on the tokens' device, overwritten.
  virtual void run(const MoeTokens& in, ExpertRunner& experts, float* y) = 0;
  // True when run() on a CUDA stream can be captured into a CUDA graph and replayed: no host waits
  // (on peers or downloads) and no host-side sizes that change from step to step. The GPU model
  // replays its decode steps as graphs only through such a backend.
  virtual bool graph_capturable() const { return false; }

 private:
  inline static std::atomic<uint64_t> next_uid_{0};
  const uint64_t uid_ = ++next_uid_;
};

struct BackendOptions {
  CombineMode combine = CombineMode::Deterministic;
  int max_dispatch_tokens_per_rank = 128;  // bounded-capacity backends
  int chunk_tokens = 64;                   // pipelined backend
  // > 0: a promise that no rank ever runs a call with more tokens. The GPU onesided backend then
  // sizes its peer-mapped buffers once and skips its per-call agreement on the capacity (an
  // allreduce and a host wait); 0: unknown.
  int max_tokens_per_rank = 0;
  Fault fault = Fault::None;               // `epmoe check --inject`: a bug class to reproduce
};

// Every name --moe-a2a-backend knows, in the order `check --moe-a2a-backend all` runs them.
std::vector<std::string> backend_names();
// The names implemented on `device`.
std::vector<std::string> backend_names(Device device);
// Creates a backend by name for `device` over `group`; throws InputError listing the valid names
// for an unknown one, the devices that support it for an unsupported pair, and an option the
// backend does not implement on that device (a combine mode, a fault class).
std::unique_ptr<A2ABackend> make_backend(const std::string& name, Device device, Group& group,
                                         const Placement& placement, const BackendOptions& opt);
// The single-process reference: every expert local, no communication (used by `check` and R = 1).
std::unique_ptr<A2ABackend> make_local_backend(Device device, const Placement& placement, const BackendOptions& opt = {});

}  // namespace epmoe
