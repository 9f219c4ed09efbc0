// A fixture's model on the CPU, one rank, with the single-process backend: what the model and
// engine tests run (the checkpoint stays open while the model lives).
#pragma once

#include <memory>
#include <string>

#include "common/golden.h"
#include "ep/backend.h"
#include "io/checkpoint.h"
#include "model/model.h"

namespace epmoe::test {

struct CpuModel {
  ModelConfig cfg;
  Checkpoint ckpt;
  Placement placement;
  Model model;
  std::unique_ptr<A2ABackend> backend;
  // compute: --compute; the fixtures' goldens are fp32.
  explicit CpuModel(const std::string& name, const KvOptions& kv = {}, LmHeadForm lm_head = LmHeadForm::Checkpoint,
                    ComputeMode compute = ComputeMode::F32)
      : cfg(load_model_config(fixture(name))),
        ckpt(fixture(name)),
        placement(Placement::make_default(cfg.routing.num_experts, 1, 0)),
        model(cfg, ckpt, placement, 0, compute, kv, lm_head),
        backend(make_local_backend(Device::Cpu, placement)) {}
};

}  // namespace epmoe::test
