// Decode steps as CUDA graphs (docs/gpu.md, "Decode as one CUDA graph"): the cache of captured
// steps and the rules for when one may be replayed. The decoder (gpu_model.cu) says what a step's
// kernels are; this file keeps the graphs, their inputs and the epochs.
//
// A step of one token per sequence on a capturable backend is captured once per key and
// replayed: every kernel argument that changes from step to step (token ids, positions, block
// tables, the rows of the logits) is read from the entry's device buffer, refreshed by one
// cudaMemcpyAsync from pinned memory before the launch. What stays baked in: the batch size
// (launch shapes, tile choices), the context bucket (the attention kernel's shared memory is
// sized for the longest context of the step), the backend (its buffers) and the addresses of
// every scratch buffer. Those only grow (DeviceArray) and only when a step runs more tokens than
// before, so:
//   - the first step of a (backend, token count) runs eagerly (`seen`): it sizes every buffer the
//     graph will hold, so a capture allocates nothing;
//   - an eager step of a token count not run before may grow buffers inside the layers (routers,
//     expert plans and runners, the backend's slot rows), and a change of the decoder's own scratch
//     addresses is seen directly (note_layout): both bump the epoch, and a graph of an older epoch
//     is captured again (cudaGraphExecUpdate into the same executable when it can) before it is
//     replayed.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/attention.cuh"
#include "model/cuda/gpu_model.h"

namespace epmoe::cuda {

// A decode step's inputs as its kernels read them (device pointers, B rows; tables: the
// sequences' block tables, concatenated).
struct StepInputs {
  const uint64_t* gids = nullptr;
  const TokenSlot* slots = nullptr;
  const int32_t* ids = nullptr;
  const int32_t* sel = nullptr;  // the rows whose logits are wanted
  const int32_t* tables = nullptr;
};

// The same inputs on the host, for one step.
struct StepInputsHost {
  const std::vector<uint64_t>& gids;
  const std::vector<TokenSlot>& slots;
  const std::vector<int32_t>& ids;
  const std::vector<int32_t>& sel;
  const std::vector<int32_t>& tables;
};

class DecodeGraphs {
 public:
  explicit DecodeGraphs(bool on) : on_(on) {}
  bool on() const { return on_; }
  void set(bool on);  // off drops the graphs held
  GpuGraphStats stats() const;

  // Something a graph holds may have moved (buffers of the layers grown): every graph is captured
  // again before its next replay.
  void invalidate() { epoch_++; }
  // The decoder's own scratch addresses now (a change invalidates).
  void note_layout(std::vector<const void*> layout);
  // After a step run kernel by kernel on `backend` (A2ABackend::uid) with T tokens.
  void note_eager_step(uintptr_t backend, int64_t T, std::vector<const void*> layout);

  // The context a graph's attention is sized for: a power of two from 256 to 4096, then multiples
  // of 4096 (few captures as sequences grow), within the attention kernel's shared memory for rows
  // of `row_width` values.
  static int ctx_bucket(int max_ctx, int row_width);

  // The step of B rows (context bucket cap) through its graph on stream s; false when it is to run
  // eagerly (the first step of its token count on this backend, or graphs turned off by a failed
  // capture). `prepare` sizes what the graph holds, outside any capture (and may note_layout);
  // `record` enqueues the step's kernels reading `StepInputs` (the graph's own buffer) while the
  // stream is captured.
  bool run(uintptr_t backend, int64_t B, int cap, int block_tokens, const StepInputsHost& in, cudaStream_t s,
           const std::function<void()>& prepare, const std::function<void(const StepInputs&)>& record);

 private:
  struct Key {
    int64_t B = 0;     // sequences (= tokens) of the step
    int ctx = 0;       // context bucket (ctx_bucket)
    uintptr_t be = 0;  // the backend's uid (A2ABackend::uid): a graph of a destroyed backend never matches
    auto operator<=>(const Key&) const = default;
  };
  struct Entry {
    cudaGraphExec_t exec = nullptr;
    uint64_t epoch = 0;  // the epoch it was captured in (0: never / its input buffer moved)
    uint64_t last_use = 0;
    size_t tables_cap = 0;  // block-table entries in_dev holds
    // The step's inputs: [gids B][slots B][ids B][sel B][tables tables_cap].
    DeviceArray<unsigned char> in_dev;
    PinnedArray<unsigned char> in_host;
    Entry() = default;
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;
    ~Entry() {
      if (exec) cudaGraphExecDestroy(exec);
    }
  };
  static constexpr size_t kMaxGraphs = 16;  // least recently used dropped beyond

  bool capture(Entry& e, int64_t B, cudaStream_t s, const std::function<void(const StepInputs&)>& record);

  bool on_ = true;
  std::map<Key, std::unique_ptr<Entry>> graphs_;
  std::set<std::pair<uintptr_t, int64_t>> seen_;  // (backend, tokens) of the eager steps run
  uint64_t epoch_ = 1, use_clock_ = 0;
  std::vector<const void*> layout_;
  GpuGraphStats stats_;
};

}  // namespace epmoe::cuda
