// The device-agnostic model interface: what the engine (the lockstep loop, the checker, the
// benchmarks) asks of a model, implemented by the CPU decoder (model/model.h) and the GPU decoder
// (model/cuda/gpu_model.h). The engine never knows which it holds.
//
// A forward pass takes new tokens of several sequences at once (data-parallel attention: the
// sequences this rank serves). The MoE layers see all of the rank's tokens together, and run even
// when the rank has none (T = 0), because the other ranks need it at the same layer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ep/backend.h"
#include "io/hf_config.h"
#include "tensor/device.h"

namespace epmoe {

// A sequence's KV cache, in the model's own layout on its device.
struct KvCache {
  virtual ~KvCache() = default;
};

struct Sequence {
  uint64_t id = 0;               // index in the user's input: feeds the token global id
  int64_t len = 0;               // tokens already in the KV cache
  std::shared_ptr<KvCache> kv;   // owned by the sequence (created by new_sequence)
};

// What to check while running (all off by default).
struct ForwardOptions {
  bool check_numerics = false;  // stop at the first layer (CPU) or the logits (GPU) with NaN/Inf
};

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  virtual const ModelConfig& config() const = 0;
  virtual Device device() const = 0;

  virtual Sequence new_sequence(uint64_t id) const = 0;

  // Appends tokens[i] to seqs[i] for every i and returns logits on the host: for each sequence,
  // all positions [n_i, V] when all_logits, else only the last [1, V] (empty when n_i = 0).
  virtual std::vector<std::vector<float>> forward(const std::vector<Sequence*>& seqs,
                                                  const std::vector<std::vector<int32_t>>& tokens,
                                                  A2ABackend& backend, bool all_logits,
                                                  const ForwardOptions& opt = {}) = 0;

  // The same step for greedy decoding: the next token of each sequence (argmax of its last
  // logits, ties to the lower id; -1 when it has no new tokens). The default computes the logits
  // on the host; a device may pick on the device (the GPU does, unless numerics are checked).
  virtual std::vector<int32_t> forward_greedy(const std::vector<Sequence*>& seqs,
                                              const std::vector<std::vector<int32_t>>& tokens, A2ABackend& backend,
                                              const ForwardOptions& opt = {});

  // The MoE (or dense MLP) block of layer l alone, host in/out: x [T, H] -> y [T, H]. For tests
  // against the goldens' per-layer input/output.
  virtual void mlp_block(int layer, const float* x, int64_t T, const uint64_t* gids, A2ABackend& backend,
                         float* y) = 0;
};

// Index of the largest logit (ties to the lower id): greedy decoding.
int32_t argmax(const float* logits, int64_t n);

}  // namespace epmoe
