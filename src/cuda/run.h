// `epmoe score|generate --device cuda`: the commands on GPUs, one process per GPU (a group of one,
// or the group started by scripts/gpu-launch.sh). No CUDA types: the CLI includes this header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace epmoe::cuda {

struct CudaRunOptions {
  std::string model_dir;
  std::string backend = "none";
  std::string compute = "bf16";  // bf16 | f32
  bool batch_invariant = false;  // every GPU kernel already is (see docs/gpu.md): accepted, no cost
  int redundant_experts = 0;
  std::string placement_file;
  int max_dispatch_tokens_per_rank = 128;
  double comm_timeout = 60.0;
  bool check_numerics = false;
};

// Logits at every position of ids (the sequence runs on rank 0; the others serve their experts),
// written by rank 0 as safetensors (tensor `logits`, F32 [T, vocab]).
void cuda_score(const CudaRunOptions& o, const std::vector<int32_t>& ids, const std::string& out);

// Greedy decoding of every prompt (prompt i on rank i mod R); returns the new tokens of every
// prompt on every rank, in input order. stop_ids end a sequence (the stop token is kept).
std::vector<std::vector<int32_t>> cuda_generate(const CudaRunOptions& o, const std::vector<std::vector<int32_t>>& prompts,
                                                int max_new_tokens, const std::vector<int>& stop_ids, int* rank);

// The eos ids of the model's config (for generate without --ignore-eos).
std::vector<int> cuda_model_eos(const std::string& model_dir);

}  // namespace epmoe::cuda
