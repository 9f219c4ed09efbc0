// Options shared by the commands that run a model, and the runtime they build: the EP group,
// the placement, the model with this rank's experts, and the a2a backend.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "comm/mpi_group.h"
#include "ep/backend.h"
#include "io/checkpoint.h"
#include "model/model.h"

namespace epmoe {

struct RunOptions {
  std::string model_dir;
  int threads = 0;
  std::string backend = "none";
  std::string combine = "deterministic";
  int redundant_experts = 0;
  std::string placement_file;
  int max_dispatch_tokens_per_rank = 128;
  int chunk_tokens = 64;
  double comm_timeout = 60.0;
  bool check_numerics = false;
  bool check_weights = false;
  std::string compute = "f32";
  bool audit = false;
  std::string device = "cpu";    // cpu | cuda (src/cuda; a build with -DEPMOE_CUDA=ON)
  bool compute_given = false;    // --compute was given (--device cuda defaults to bf16 without it)
  bool batch_invariant = false;  // --device cuda: its kernels are batch-invariant in every mode
};

void add_model_option(CLI::App& cmd, RunOptions& o);
void add_run_options(CLI::App& cmd, RunOptions& o, bool with_backend = true);
// --device cpu|cuda and --batch-invariant (score and generate; after add_run_options).
void add_device_options(CLI::App& cmd, RunOptions& o);

struct Runtime {
  MpiGroup* comm = nullptr;
  ModelConfig cfg;
  std::unique_ptr<Checkpoint> ckpt;
  Placement placement;
  std::unique_ptr<Model> model;
  std::unique_ptr<A2ABackend> backend;
  BackendOptions backend_options;
};

// The options a backend is built with.
BackendOptions backend_options(const RunOptions& o);

// Builds everything a model-running command needs, in the order that reports input errors
// before any collective work starts.
Runtime make_runtime(const RunOptions& o);

// Refuses, before any work, a prompt the model cannot take: an id outside the vocabulary, or more
// positions than max_position_embeddings (the prompt plus the new_tokens - 1 tokens fed back
// while generating). InputError naming `what` (the flag or file:line) and the config.
void check_prompt(const std::vector<int32_t>& ids, const ModelConfig& cfg, const std::string& what, int new_tokens);

// --device: true for cuda; InputError when this epmoe was built without CUDA.
bool use_cuda(const RunOptions& o);

// "1,2,3" -> ids; throws InputError naming the flag on bad syntax.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& what);
std::string join_ids(const std::vector<int32_t>& ids);

}  // namespace epmoe

#ifdef EPMOE_HAVE_CUDA
#include "cuda/run.h"
namespace epmoe {
// The options of the GPU path (src/cuda/run.h).
cuda::CudaRunOptions cuda_options(const RunOptions& o);
}  // namespace epmoe
#endif
