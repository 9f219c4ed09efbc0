// `epmoe check`, device-agnostic: every chosen backend against the single-process reference, on
// the device the engine runs (CPUs under mpirun, GPUs under scripts/gpu-launch.sh). For each
// backend: the reduction audit with probe experts (check/audit.h), then the log-probabilities,
// bits and greedy tokens of real sequences (check/differential.h). The CLI prints the result.
// The models come from the engine (engine/runtime.h) as in every command, the reference from a
// second runtime on the solo placement: a run option acts here as in generate, or is refused.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "check/audit.h"
#include "check/differential.h"
#include "engine/runtime.h"

namespace epmoe {

struct CheckOptions {
  EngineOptions engine;               // engine.backend is ignored: `backends` run one after the other
  std::vector<std::string> backends;  // empty: every backend of the device
  int prompts = 8, prompt_len = 16, gen_tokens = 8;
  uint64_t seed = 1;
  // "local": each rank recomputes its sequences with every expert in-process (the model must
  // fit); else a logits file written by a single-process `epmoe score` (rank 0's sequence).
  std::string reference = "local";
};

struct CheckRow {
  std::string backend;
  AuditResult audit;
  BackendStats stats;
  bool pass = false;
};

struct CheckResult {
  int rank = 0, ranks = 1;
  bool exact = true;  // deterministic combine: logits must be bit-identical
  ModelConfig cfg;
  std::vector<CheckRow> rows;  // over all ranks, on every rank
  bool pass() const;
};

// Collective over the device's group. InputError for a bad name, an unsupported (backend,
// device) pair or an option the device lacks, before any weight is read.
CheckResult run_check(const CheckOptions& o);

// "all" or "a,b,c" -> names (validated later by the registry).
std::vector<std::string> parse_backend_list(const std::string& spec, Device device);

}  // namespace epmoe
