// The decoder on one GPU, behind model/language_model.h: embedding -> layers (RMSNorm, attention
// over the paged KV cache, RMSNorm, dense MLP or the MoE layer behind an A2ABackend) -> final norm ->
// lm_head. The same data flow and numerics as src/model/model.cc (the CPU reference), with
//   --compute bf16 (default): bf16 tensor cores, fp32 accumulation, fp32 residual stream, norms,
//                             softmax, RoPE and KV cache; the routed experts of a bf16 checkpoint
//                             on bf16 activations, every other product fp32-grade through hi/lo
//                             bf16 splits (kernels/cuda/split_linear.cuh), weights stored in fp32
//                             kept exact
//   --compute f32:            everything in fp32
// Every kernel is batch-invariant (no split-K, per-row reductions in a fixed order), so a row's
// logits do not depend on the other rows of the batch.
//
// The KV cache is one pool on the device (model/kv_pool.h), allocated when the model is made, after
// its weights: kv.tokens positions, or kv_pool_tokens' share of the memory then free.
//
// The model runs on the process's GPU and stream: call kernels/cuda/device.h init_device(rank) (or
// NcclGroup::world(), which does) before making one. Its backends must be of Device::Cuda.
// No CUDA types here: the engine includes this header.
#pragma once

#include <cstdint>
#include <memory>

#include "ep/placement.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "model/language_model.h"

namespace epmoe {

// How the routed experts of an FP8 block-quantized checkpoint compute on the GPU (docs/gpu.md,
// "FP8 on the tensor cores").
enum class GpuFp8Compute {
  // The default: dequantized on upload (code x block scale in fp32, the CPU's bits), then computed
  // as an fp32 checkpoint's experts: the arithmetic of the CPU and of the goldens.
  Dequant,
  // Kept in e4m3 on the device (1 byte per weight + a scale per row and 128-block), activations
  // quantized per token and 128-channel group to e4m3, fp8 tensor-core MMAs with the block scales
  // applied in an fp32 accumulation (sglang's / vLLM's w8a8 block-fp8 MoE). Batch-invariant;
  // needs every routed expert in F8_E4M3 with 128 x 128 scale blocks (InputError otherwise).
  TensorCore,
};

struct GpuModelOptions {
  bool f32 = false;  // --compute f32 (else bf16)
  GpuFp8Compute fp8 = GpuFp8Compute::Dequant;
  KvOptions kv;
  // Decode steps (one token per sequence, the single-GPU `local` backend) replayed as one CUDA
  // graph per batch size (docs/gpu.md, "Decode as one CUDA graph"); the environment's
  // EPMOE_CUDA_GRAPH=0 also turns it off. The same bits either way.
  bool cuda_graph = true;
};

// What the decode graphs of a GPU model did (tests and benchmarks).
struct GpuGraphStats {
  int64_t captures = 0;     // graphs captured (a new batch size / context bucket, or buffers that moved)
  int64_t replays = 0;      // steps run as a graph launch
  int64_t eager_steps = 0;  // steps run kernel by kernel (prefill, mixed steps, first step of a batch size, off)
  int64_t cached = 0;       // graphs held now
};
// Turns the decode graphs of a model made by make_gpu_model / make_synthetic_gpu_model on or off
// (off drops the graphs held); InputError for any other model.
void set_gpu_cuda_graph(LanguageModel& m, bool on);
GpuGraphStats gpu_graph_stats(const LanguageModel& m);

// Non-expert weights and the experts `placement` gives to `rank`, from the checkpoint.
std::unique_ptr<LanguageModel> make_gpu_model(const ModelConfig& cfg, const Checkpoint& ckpt,
                                              const Placement& placement, int rank, const GpuModelOptions& opt);
// The same with the default FP8 handling; f32: --compute f32 (else bf16).
std::unique_ptr<LanguageModel> make_gpu_model(const ModelConfig& cfg, const Checkpoint& ckpt,
                                              const Placement& placement, int rank, bool f32,
                                              const KvOptions& kv = {});

// The same shapes with pseudo-random weights generated on the device (benchmarks): uniform with
// the variance of a unit-gain init, norms of one.
std::unique_ptr<LanguageModel> make_synthetic_gpu_model(const ModelConfig& cfg, const Placement& placement, int rank,
                                                        bool f32, uint64_t seed, const KvOptions& kv = {});

}  // namespace epmoe
