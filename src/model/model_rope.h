// The rope a model config asks for, written once for both devices: default or YaRN frequencies
// (computed on the host in fp32, as transformers does), cos/sin times YaRN's attention_factor,
// half-split pairs or interleaved ones (latent attention with rope_interleave).
#pragma once

#include "io/hf_config.h"
#include "kernels/ops.h"

namespace epmoe {

Rope model_rope(const ModelConfig& cfg);

}  // namespace epmoe
