// Runtime assembly: options -> group + placement + model + backend, for either device. The one
// place that knows which device runs (the CLI hands it a device name; nothing above or below asks
// again): the group over MPI or NCCL, the CPU or GPU model, the run context of the kernels.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"
#include "ep/backend.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "model/language_model.h"
#include "tensor/device.h"

namespace epmoe {

// Everything a command that runs a model chooses (the CLI's flags, or a test's literal).
struct EngineOptions {
  std::string model_dir;
  Device device = Device::Cpu;
  std::string backend = "none";
  BackendOptions backend_options;  // combine, capacity, chunks, injected fault
  int redundant_experts = 0;
  std::string placement_file;
  double comm_timeout = 60.0;
  bool check_weights = false;  // scan the weights this rank loads for NaN/Inf
  // The run context: compute mode (given to the model), threads (the process's pool), checks.
  std::string compute;  // f32 | bf16 | "" (the device's default: cpu f32, cuda bf16)
  // FP8 checkpoints' routed experts: dequant (exact, the default) | tensor-core (cuda only:
  // e4m3 weights and activations on the fp8 tensor cores, docs/gpu.md run 13).
  std::string fp8_compute = "dequant";
  // The lm_head: checkpoint (exact, the default) | int8 (cpu only: rows quantized at load,
  // model/weights.h LmHeadForm).
  std::string lm_head = "checkpoint";
  int threads = 0;      // CPU worker threads per rank (0: the cores available)
  ForwardOptions forward;
  KvOptions kv;         // the paged KV cache's pool (--kv-cache-tokens)
  // The single-process reference of `epmoe check`: every expert on this rank (the placement of one
  // rank, whatever the group's size) behind the local backend with its default options -- no
  // communication, no injected fault, so the reference cannot share a backend's bug. `backend`,
  // `backend_options` and the placement options are unused; every other option acts as in a run.
  bool solo = false;
};

// The compute mode a device runs with for `compute` ("" -> its default); InputError otherwise.
std::string resolve_compute(Device device, const std::string& compute);

// The group of `device` (MPI on CPUs, NCCL on GPUs), with its timeout, made the active group.
Group& start_group(Device device, double comm_timeout);

// Applies the process-wide part of the run context: the CPU's worker threads (one pool per
// process). The compute mode is not process-wide: each model takes it at construction
// (make_model), and faults travel in the backend's options.
void apply_run_context(const EngineOptions& o);

// The default placement (E experts, R ranks, N replicas) or the --placement file's.
Placement make_placement(const EngineOptions& o, int num_experts, int ranks);

// The model of `device` with the experts `placement` gives to `rank`, and its KV pool.
std::unique_ptr<LanguageModel> make_model(Device device, const ModelConfig& cfg, const Checkpoint& ckpt,
                                          const Placement& placement, int rank, const std::string& compute,
                                          const KvOptions& kv = {}, const std::string& fp8_compute = "dequant",
                                          const std::string& lm_head = "checkpoint");

struct Runtime {
  Device device = Device::Cpu;
  Group* group = nullptr;
  ModelConfig cfg;
  std::unique_ptr<Checkpoint> ckpt;
  Placement placement;
  std::unique_ptr<LanguageModel> model;
  std::unique_ptr<A2ABackend> backend;
  EngineOptions options;
  int model_rank = 0;  // whose experts the model holds: the group's rank, 0 for a solo runtime
};

// Everything a model-running command needs, in the order that reports input errors (unknown
// backend, unsupported pair, bad placement file) before any weight is read: make_runtime is
// prepare_runtime (group, config, checkpoint, placement, backend; no weight read) then load_model
// (--check-weights, then the model and its KV pool). `check` takes the two steps apart to make
// every backend and the reference before the checked model takes its memory.
Runtime make_runtime(const EngineOptions& o);
Runtime prepare_runtime(const EngineOptions& o);
void load_model(Runtime& rt);

}  // namespace epmoe
