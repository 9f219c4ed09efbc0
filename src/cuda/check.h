// `epmoe check --device cuda`: every GPU backend against the single-GPU reference, as the CPU
// check does (src/cli/check.cc): a reduction audit with probe experts, then the log-probabilities,
// bits and greedy tokens of real sequences. One process per GPU (scripts/gpu-launch.sh).
// No CUDA types: the CLI includes this header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "check/audit.h"
#include "check/differential.h"
#include "cuda/ep.h"
#include "cuda/run.h"
#include "ep/fault.h"

namespace epmoe::cuda {

struct CudaCheckOptions {
  CudaRunOptions run;  // run.backend is ignored: `backends` are checked one after the other
  std::vector<std::string> backends;
  int prompts = 8, prompt_len = 16, gen_tokens = 8;
  uint64_t seed = 1;
  Fault fault = Fault::None;  // GPU backends implement DoubleReduce only
};

struct CudaCheckRow {
  std::string backend;
  AuditResult audit;
  BackendStats stats;
};

struct CudaCheckResult {
  int rank = 0, ranks = 1;
  int vocab = 0;
  std::vector<CudaCheckRow> rows;  // results over all ranks, on every rank
};

// Collective over the GPU group. The reference: every rank recomputes its own sequences with all
// experts on its GPU and no backend (the model must fit on one GPU).
CudaCheckResult cuda_check(const CudaCheckOptions& o);

}  // namespace epmoe::cuda
