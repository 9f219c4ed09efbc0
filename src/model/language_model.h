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
#include <utility>
#include <vector>

#include "ep/backend.h"
#include "io/hf_config.h"
#include "model/kv_pool.h"
#include "tensor/device.h"

namespace epmoe {

struct Sequence {
  uint64_t id = 0;               // index in the user's input: feeds the token global id
  int64_t len = 0;               // tokens already in the KV cache
  std::shared_ptr<KvCache> kv;   // its blocks in the model's pool (released with the last holder)
};

// What the KV pool stores its values as (--kv-cache-dtype). Attention reads them into fp32 either
// way and sums in the same order, so every guarantee of bits across batch, layout, chunking and
// backends holds for each; bf16 rounds K and V once, when they are written (both the rollout and
// its re-score read the same rounded rows).
enum class KvDtype {
  Auto,  // the model's dtype: bf16 on the GPU for a bf16 checkpoint computed in bf16, else fp32
  F32,
  BF16,  // GPU only: half the bytes per token, twice the positions, half the KV reads of a step
};
// "auto", "bf16", "fp32" (InputError naming --kv-cache-dtype otherwise).
KvDtype parse_kv_dtype(const std::string& s);
const char* kv_dtype_name(KvDtype d);

// The GPU's share of its memory the weights and the KV pool may take together when the pool is
// sized by default (sglang's --mem-fraction-static): the rest stays for activations, CUDA graphs,
// NCCL and other processes' contexts.
// 0.80: on an H200 with the 48-layer Qwen3-30B-A3B, 0.88 (sglang's usual figure) left 17 GiB, too
// little for one 32K-token step (256 prompts of 128 tokens prefilled at once).
constexpr double kDefaultGpuMemFraction = 0.80;

// The paged KV cache of a model: how many token positions its pool holds (0: the device's
// default, kv_pool_tokens) in blocks of how many, as what.
struct KvOptions {
  int64_t tokens = 0;
  int block_tokens = 16;
  KvDtype dtype = KvDtype::F32;  // Auto is resolved by the engine (make_model) before a model sees it
  double mem_fraction = 0;       // GPU, tokens = 0: the share above (0: kDefaultGpuMemFraction)
};

// The pool size for `opt` at `bytes_per_token` (K and V of every layer): opt.tokens when given;
// else on the CPU a quarter of `free_bytes` (the memory available), on the GPU what the weights
// leave under mem_fraction of the device's `total_bytes` (free - (1 - fraction) total; an
// InputError naming --mem-fraction when that is not one block); at most 1M tokens, rounded up to
// whole blocks.
int64_t kv_pool_tokens(const KvOptions& opt, Device device, int64_t free_bytes, int64_t bytes_per_token,
                       int64_t total_bytes = 0);

// The host memory available now (MemAvailable), for the CPU pool's default.
int64_t available_memory_bytes();

// Routing replay (R3: sglang's return_routed_experts, Megatron's RouterReplay): for each token of
// a forward (the sequences' new tokens in order) and each MoE layer (in layer order), the top-k
// logical experts in top-k order and their fp32 weights (what the combine multiplies by).
struct StepRouting {
  int moe_layers = 0, K = 0;
  std::vector<int32_t> ids;    // [T][moe_layers][K]
  std::vector<float> weights;  // [T][moe_layers][K]
  int64_t tokens() const { return moe_layers * K > 0 ? int64_t(ids.size()) / (int64_t(moe_layers) * K) : 0; }
};

// What to check while running (all off by default), and routing replay.
struct ForwardOptions {
  bool check_numerics = false;  // stop at the first layer (CPU) or the logits (GPU) with NaN/Inf
  // Both devices: capture is filled with every token's routing; with
  // replay every token's routing is the one given and no router runs (an InputError when its
  // shape is not the step's or an id is not an expert).
  StepRouting* capture = nullptr;
  const StepRouting* replay = nullptr;
};

// One token to draw after a forward (LanguageModel::forward_draw).
struct DrawRequest {
  int row = 0;             // index in the forward's sequences
  float temperature = 0;   // 0: greedy (the log-prob is then temperature 1's)
  uint64_t seed = 0;
  int64_t position = 0;    // the drawn token's absolute position
  int top_n = 0;           // also the row's top_n most likely ids (0..kMaxDrawTopN; OpenAI logprobs: N)
};
// The most alternatives a device draw reports (serve's max_top_logprobs, OpenAI's limit).
constexpr int kMaxDrawTopN = 20;
struct Drawn {
  int32_t token = -1;
  float logprob = 0;  // log_softmax(logits / T)[token]
  // The request's top_n ids with their log-probs: RowLogprobs(row, T).top(top_n), the same order
  // and bits (min(top_n, V) entries).
  std::vector<std::pair<int32_t, float>> top;
};

// One model step (LanguageModel::step): the new tokens of several sequences, and for each
// sequence what it wants back. Every device implements this one call; forward, forward_greedy and
// forward_draw below are its three common shapes.
enum class StepWant {
  Nothing,    // no output (its logits are never computed: a prompt chunk nobody reads)
  Logits,     // the logits of its last new token, [1, V] on the host
  AllLogits,  // the logits of every new token, [n, V] on the host
  Argmax,     // the argmax of its last logits (ties to the lower id), picked where the logits are
  Draw,       // tokens drawn from its last logits (StepBatch::draws; draws_on_device() models only)
};
struct StepBatch {
  std::vector<Sequence*> seqs;
  std::vector<std::vector<int32_t>> tokens;  // appended to seqs[i], one list per sequence
  std::vector<StepWant> want;                // one per sequence
  // The draws from Draw rows' last logits (DrawRequest::row), any number from one row (the n
  // samples of one prompt draw their first tokens from its last row).
  std::vector<DrawRequest> draws;
  ForwardOptions opt;
};
struct StepResult {
  std::vector<std::vector<float>> logits;  // per sequence: its rows for Logits / AllLogits, else empty
  std::vector<int32_t> argmax;             // per sequence: Argmax's token (-1 otherwise or without new tokens)
  std::vector<Drawn> drawn;                // per draw: the token, its log-prob and top_n alternatives
};

// Which rows of a sequence a step computes logits for (every device's lm_head runs on these only):
// Logits, Argmax and Draw want the last new row, AllLogits every new row, Nothing none.
enum class LogitRows { None, Last, All };
std::vector<LogitRows> logit_rows_of(const StepBatch& batch);

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  virtual const ModelConfig& config() const = 0;
  virtual Device device() const = 0;

  // The pool every sequence's KV blocks come from (engine/scheduler.h admits against it).
  virtual KvPool& kv_pool() = 0;

  // A new empty sequence whose KV writes take unpromised blocks of the pool (the scheduler admits
  // through the pool instead, with the blocks a request needs promised).
  Sequence new_sequence(uint64_t id) { return Sequence{id, 0, kv_pool().open()}; }

  // The step: appends batch.tokens[i] to batch.seqs[i] for every i (the KV cache written, each
  // sequence's len advanced) and returns what each row wants. The one forward call a device
  // implements.
  virtual StepResult step(const StepBatch& batch, A2ABackend& backend) = 0;

  // Whether step() takes StepWant::Draw (tokens drawn where the logits are, engine/sampling.h
  // without masks: the same bits as sample_token and RowLogprobs (at, top) on the host give for
  // those logits). The GPU does; on the CPU the host draws from the logits.
  virtual bool draws_on_device() const { return false; }

  // step() with every sequence's logits on the host: all positions [n_i, V] when all_logits, else
  // only the last [1, V] (empty when n_i = 0).
  std::vector<std::vector<float>> forward(const std::vector<Sequence*>& seqs,
                                          const std::vector<std::vector<int32_t>>& tokens, A2ABackend& backend,
                                          bool all_logits, const ForwardOptions& opt = {});
  // step() for greedy decoding: the next token of each sequence (argmax of its last logits, ties to
  // the lower id; -1 when it has no new tokens), picked on the device where the model can.
  std::vector<int32_t> forward_greedy(const std::vector<Sequence*>& seqs,
                                      const std::vector<std::vector<int32_t>>& tokens, A2ABackend& backend,
                                      const ForwardOptions& opt = {});
  // step() with one draw per entry of `draws`, from the last logits of seqs[draw.row] (any number
  // a row; rows without a draw compute no logits); only the tokens, their log-probs and top_n
  // alternatives come back, in the order of `draws`. draws_on_device() models only.
  std::vector<Drawn> forward_draw(const std::vector<Sequence*>& seqs, const std::vector<std::vector<int32_t>>& tokens,
                                  A2ABackend& backend, const std::vector<DrawRequest>& draws,
                                  const ForwardOptions& opt = {});

  // The MoE (or dense MLP) block of layer l alone, host in/out: x [T, H] -> y [T, H]. For tests
  // against the goldens' per-layer input/output.
  virtual void mlp_block(int layer, const float* x, int64_t T, const uint64_t* gids, A2ABackend& backend,
                         float* y) = 0;
};

// The first thing a forward does on every device: room in `pool` for each sequence's new tokens
// (copy on write of a shared partial block included), after checking that the sequence's cache is
// this pool's and holds its len tokens.
void append_step_tokens(KvPool& pool, const std::vector<Sequence*>& seqs,
                        const std::vector<std::vector<int32_t>>& tokens);

// Index of the largest logit (ties to the lower id): greedy decoding.
int32_t argmax(const float* logits, int64_t n);

}  // namespace epmoe
