// The flags shared by the commands that run a model (cli/flags.cc binds them), turned into the
// engine's options: the one place where the CLI turns --device into a Device (the engine does the
// rest).
#pragma once

#include <string>
#include <vector>

#include "engine/runtime.h"
#include "io/hf_config.h"
#include "tensor/device.h"
#include "util/token_ids.h"

namespace epmoe {

struct RunOptions {
  std::string model_dir;
  std::string device = device_name(Device::Cpu);  // a name of tensor/device.h device_names()
  std::string backend = "none";
  std::string combine = "deterministic";
  int redundant_experts = 0;
  std::string placement_file;
  int max_dispatch_tokens_per_rank = 128;
  int chunk_tokens = 64;
  double comm_timeout = 60.0;
  bool check_numerics = false;
  bool check_weights = false;
  std::string compute;  // "" until given: the device's default (cpu f32, cuda bf16)
  std::string fp8_compute = "dequant";
  std::string lm_head = "checkpoint";  // --lm-head
  int threads = 0;
  bool audit = false;
  bool batch_invariant = false;  // accepted everywhere: every kernel of both devices already is
  int64_t kv_cache_tokens = 0;   // 0: the device's default (model/language_model.h kv_pool_tokens)
  int kv_block_tokens = 16;
  std::string kv_cache_dtype = "auto";  // --kv-cache-dtype
  double mem_fraction = 0;              // --mem-fraction (0: the default, kDefaultGpuMemFraction)
  // Not a flag: set by the commands whose steps the scheduler bounds (--max-batch-tokens), so that
  // backends may size their buffers once and skip agreeing on sizes each call (0: no bound).
  int64_t max_tokens_per_call = 0;
};

// The engine's options for these flags (the device parsed here, once).
EngineOptions engine_options(const RunOptions& o);

// The runtime of these flags (engine/runtime.h), after the reduction audit when --audit asks.
Runtime start_runtime(const RunOptions& o);

// Refuses, before any work, a prompt the model cannot take: an id outside the vocabulary, or more
// positions than max_position_embeddings (the prompt plus the new_tokens - 1 tokens fed back
// while generating). InputError naming `what` (the flag or file:line) and the config.
void check_prompt(const std::vector<int32_t>& ids, const ModelConfig& cfg, const std::string& what, int new_tokens);

}  // namespace epmoe
