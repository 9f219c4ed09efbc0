// The decoder on one GPU: embedding -> layers (RMSNorm, attention with a KV cache, RMSNorm, dense
// MLP or the MoE layer behind a GpuBackend) -> final norm -> lm_head. The same data flow and
// numerics as src/model/model.cc (the CPU reference), with
//   --compute bf16 (default): bf16 tensor cores, fp32 accumulation, fp32 residual stream, norms,
//                             softmax, RoPE and KV cache; the routed experts of a bf16 checkpoint
//                             on bf16 activations, every other product fp32-grade through hi/lo
//                             bf16 splits (split_linear.cuh), weights stored in fp32 kept exact
//   --compute f32:            everything in fp32
// Every kernel is batch-invariant (no split-K, per-row reductions in a fixed order), so a row's
// logits do not depend on the other rows of the batch.
//
// No CUDA types here: the CLI includes this header.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/ep.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"

namespace epmoe::cuda {

struct GpuOptions {
  bool f32 = false;  // --compute f32
};

struct GpuKvCache;  // device K/V of one sequence, every layer

struct GpuSequence {
  uint64_t id = 0;   // index in the user's input: feeds the token global id
  int64_t len = 0;   // tokens already in the cache
  std::shared_ptr<GpuKvCache> kv;
};

class GpuModel {
 public:
  // Non-expert weights and the experts `placement` gives to `rank`, from the checkpoint.
  GpuModel(const ModelConfig& cfg, const Checkpoint& ckpt, const Placement& placement, int rank,
           const GpuOptions& opt);
  // The same shapes with pseudo-random weights generated on the device (benchmarks).
  GpuModel(const ModelConfig& cfg, const Placement& placement, int rank, const GpuOptions& opt, uint64_t seed);
  ~GpuModel();
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  const ModelConfig& config() const;
  GpuSequence new_sequence(uint64_t id) const;

  // As Model::forward: appends tokens[i] to seqs[i]; returns, per sequence, the logits of all
  // its new positions [n_i, V] (all_logits) or of the last one [1, V] (empty when n_i = 0).
  std::vector<std::vector<float>> forward(const std::vector<GpuSequence*>& seqs,
                                          const std::vector<std::vector<int32_t>>& tokens, GpuBackend& backend,
                                          bool all_logits);

  // The same step for greedy decoding: the next token of each sequence (argmax of its last
  // logits on the device, ties to the lower id; -1 when it has no new tokens).
  std::vector<int32_t> forward_greedy(const std::vector<GpuSequence*>& seqs,
                                      const std::vector<std::vector<int32_t>>& tokens, GpuBackend& backend);

  // The MoE (or dense MLP) block of a layer alone, host in/out: x [T, H] -> y [T, H].
  void mlp_block(int layer, const float* x, int64_t T, const uint64_t* gids, GpuBackend& backend, float* y);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace epmoe::cuda
