// The backend contract of src/ep/backend.h, on GPUs: a backend receives this rank's tokens (device
// pointers) and the expert runner, and writes y[T, H] (fp32, device): the FINAL routed output of
// this rank's tokens, sum_k w_k * expert_k(x), reduced exactly once. Dispatch -> experts ->
// combine all happen inside run(); the model never knows which backend runs.
//
// Deterministic combine only (as the CPU default): one row per (token, slot) comes home and is
// summed in slot order in fp32 by the same kernel on every backend, and the expert GEMMs are
// batch-invariant, so the logits are bit-identical for every GPU count and backend.
//
// This header has no CUDA types: the CLI includes it. Device pointers are plain pointers; every
// kernel runs on the process's stream (cuda::stream()).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ep/placement.h"

namespace epmoe::cuda {

struct GpuMoeTokens {
  int64_t T = 0;  // this rank's tokens (0: the rank still joins the exchange)
  int H = 0, K = 0;
  bool bf16 = true;                   // element type of x and of expert outputs (else fp32)
  const void* x = nullptr;            // [T, H]
  const int32_t* physical = nullptr;  // [T, K] physical expert of each slot (replica chosen)
  const float* weights = nullptr;     // [T, K]
};

// Rows for the local experts: row r is at x + r * x_stride (elements), its K physical ids at
// phys + r * phys_stride (ids not owned here are skipped). Outputs, one row of H per served
// (row, slot): at row*K + k (compact = false) or at the job's index among the served jobs in
// (row, slot) order (compact = true; row_base, when given, receives each row's first index and,
// at [rows], the total).
struct GpuExpertJobs {
  const void* x = nullptr;
  int64_t x_stride = 0;
  const int32_t* phys = nullptr;
  int64_t phys_stride = 0;
  int64_t rows = 0;                   // bound known on the host
  const int32_t* rows_dev = nullptr;  // actual count on the device (bounded-capacity rounds), or nullptr
  int K = 0;
  bool compact = false;
  bool one_per_row = false;  // output row = row (each row has at most one served slot)
  int32_t* row_base = nullptr;
};

class GpuExpertRunner {
 public:
  virtual ~GpuExpertRunner() = default;
  // out: rows of H elements of the activation type.
  virtual void run(const GpuExpertJobs& jobs, void* out) = 0;
};

class GpuBackend {
 public:
  virtual ~GpuBackend() = default;
  virtual std::string name() const = 0;
  virtual void run(const GpuMoeTokens& in, GpuExpertRunner& experts, float* y) = 0;
};

// The single-GPU path (every expert local, no communication): the reference of the others.
std::unique_ptr<GpuBackend> make_local_gpu_backend(const Placement& p);

// A group of GPU processes (one per GPU) over NCCL, started by scripts/gpu-launch.sh:
// EPMOE_RANK, EPMOE_WORLD_SIZE and EPMOE_NCCL_ID_FILE (rank 0 writes the unique id there).
// Without EPMOE_WORLD_SIZE (or with 1) it is a group of one and NCCL is never initialised.
class GpuGroup {
 public:
  static GpuGroup& world();
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool distributed() const { return size_ > 1; }
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  // Host-value collectives (through the device; each synchronises the stream).
  int64_t allreduce_max(int64_t v);
  int64_t allreduce_sum(int64_t v);
  bool any(bool v) { return allreduce_max(v ? 1 : 0) != 0; }
  std::vector<int64_t> allgather(int64_t v);
  // Every rank's vector (equal lengths), concatenated in rank order.
  std::vector<int64_t> allgather(const std::vector<int64_t>& v);
  // Bytes this rank sent to other ranks (payload), for benchmarks.
  uint64_t bytes_sent() const { return bytes_sent_; }
  void add_bytes_sent(uint64_t n) { bytes_sent_ += n; }
  void* nccl_comm() const { return comm_; }  // ncclComm_t
  double timeout() const { return timeout_s_; }
  // Waits for the stream with the group's timeout (NCCL aborts the communicator when it passes).
  void sync(const char* what);
  ~GpuGroup();

 private:
  GpuGroup();
  int rank_ = 0, size_ = 1;
  void* comm_ = nullptr;
  double timeout_s_ = 60.0;
  uint64_t bytes_sent_ = 0;
};

struct GpuBackendOptions {
  int max_dispatch_tokens_per_rank = 128;  // capacity per round of the bounded-capacity backend
};

// Names accepted by --moe-a2a-backend with --device cuda, in the order `check` runs them.
std::vector<std::string> gpu_backend_names();
// Over the group; with a group of one, every name is the local path (as on the CPU).
std::unique_ptr<GpuBackend> make_gpu_backend(const std::string& name, GpuGroup& group, const Placement& p,
                                             const GpuBackendOptions& opt);

// Selects the GPU of this process (rank modulo the visible devices) and creates its stream.
void init_device(int rank);

}  // namespace epmoe::cuda
