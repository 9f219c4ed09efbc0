// The decoder on one GPU (model/cuda/gpu_model.h): GpuModel<T> implements LanguageModel with T the
// activation type of --compute (bf16 or float).
#include "model/cuda/gpu_model.h"
#include "util/env.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/split_linear.cuh"
#include "ep/cuda/plan_combine.cuh"
#include "kernels/ops.h"
#include "kernels/cuda/attention.cuh"
#include "model/cuda/decode_graphs.cuh"
#include "model/cuda/sampling.cuh"
#include "model/decoder.h"
#include "model/model_rope.h"
#include "model/weights.h"
#include "moe/cuda/experts.cuh"
#include "moe/cuda/moe_ops.cuh"
#include "moe/cuda/routing.cuh"
#include "moe/moe_block.h"
#include "moe/moe_layer.h"
#include "tensor/cuda/staged_upload.h"
#include "tensor/dtype.h"
#include "util/error.h"

namespace epmoe::cuda {

static_assert(kMaxDrawTopN <= kMaxTopRows, "a draw's top_n must fit top_rows' lists");

namespace {

// --check-numerics on the GPU: the logits, on the host.
void check_finite(const std::vector<float>& v, const char* what) {
  for (size_t i = 0; i < v.size(); i++)
    if (!std::isfinite(v[i]))
      throw CheckError(std::string("--check-numerics: ") + what + " produced " + (std::isnan(v[i]) ? "NaN" : "Inf") +
                       " (element " + std::to_string(i) + ")");
}

template <class T>
std::vector<T> from_floats(const std::vector<float>& f) {
  if constexpr (std::is_same_v<T, float>) {
    return f;
  } else {
    std::vector<T> out(f.size());
    for (size_t i = 0; i < f.size(); i++) {
      __nv_bfloat16_raw r;
      r.x = f32_to_bf16(f[i]);  // round to nearest even, as torch
      out[i] = r;
    }
    return out;
  }
}

template <class T>
void upload_at(DeviceArray<T>& dst, size_t offset, const std::vector<T>& h) {
  EPMOE_ASSERT(offset + h.size() <= dst.capacity(), "gpu weights: upload past the allocation");
  if (!h.empty())
    EPMOE_CUDA_CHECK(cudaMemcpy(dst.data() + offset, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// gate [I, H] and up [I, H] -> [2I, H] with gate row j at 2j and up row j at 2j + 1.
std::vector<float> interleave_gate_up(const TensorView& gate, const TensorView& up) {
  const std::vector<float> g = to_f32(gate), u = to_f32(up);
  const int64_t I = gate.shape[0], H = gate.shape[1];
  std::vector<float> out(static_cast<size_t>(2 * I * H));
  for (int64_t j = 0; j < I; j++) {
    std::memcpy(&out[size_t(2 * j * H)], &g[size_t(j * H)], sizeof(float) * size_t(H));
    std::memcpy(&out[size_t((2 * j + 1) * H)], &u[size_t(j * H)], sizeof(float) * size_t(H));
  }
  return out;
}

// ---- The staged upload of a checkpoint (tensor/cuda/staged_upload.h, issue 33).
// Weights whose stored dtype is the device's, or widens to it exactly (BF16 into bf16 or fp32,
// F32 into fp32), go from the mapped file into pinned staging memory in their device layout, row
// by row, on the uploader's threads: the same bytes the converting path (to_f32, from_floats,
// one cudaMemcpy) writes, at the link's rate. Anything else (FP8 dequantized, F16, F32 rounded or
// split for bf16) keeps that path.
template <class T>
bool stages_as_is(const TensorView& v) {
  return v.rank() == 2 && (v.dtype == DType::BF16 || (v.dtype == DType::F32 && std::is_same_v<T, float>));
}

template <class T>
void convert_row(T* d, const char* s, DType src, int64_t n) {
  if (src == DType::F32 || std::is_same_v<T, bf16>) {  // (F32 into bf16 never stages)
    std::memcpy(d, s, size_t(n) * sizeof(T));
    return;
  }
  if constexpr (std::is_same_v<T, float>) {  // BF16 widened: its bits in the high half
    const auto* h = reinterpret_cast<const uint16_t*>(s);
    for (int64_t i = 0; i < n; i++) {
      const uint32_t u = uint32_t(h[i]) << 16;
      std::memcpy(&d[i], &u, 4);
    }
  }
}

// A destination of `rows` rows of W values of T, row r read from row_ptr(r) (W values of `src`).
template <class T, class RowPtr>
StagedUploader::Fill rows_fill(int64_t W, DType src, RowPtr row_ptr) {
  return [=](char* staging, size_t off, size_t len) {
    EPMOE_ASSERT(off % sizeof(T) == 0 && len % sizeof(T) == 0, "staged upload: a piece not on a value boundary");
    const int64_t first = int64_t(off / sizeof(T)), n = int64_t(len / sizeof(T));
    T* out = reinterpret_cast<T*>(staging);
    for (int64_t e = first; e < first + n;) {
      const int64_t r = e / W, c = e % W, m = std::min(W - c, first + n - e);
      convert_row(out + (e - first), row_ptr(r) + c * int64_t(dtype_size(src)), src, m);
      e += m;
    }
  };
}

// The rows of `parts` one after another ([q; k; v] of the fused projection, or one tensor).
// `alloc(rows, W)` gives the destination once the parts are known to stage.
template <class T, class Alloc>
bool stage_rows(StagedUploader& up, Alloc alloc, std::vector<TensorView> parts) {
  for (const TensorView& v : parts)
    if (!stages_as_is<T>(v) || v.dtype != parts[0].dtype || v.shape[1] != parts[0].shape[1]) return false;
  const int64_t W = parts[0].shape[1];
  const size_t rb = size_t(W) * dtype_size(parts[0].dtype);
  std::vector<int64_t> start{0};
  for (const TensorView& v : parts) start.push_back(start.back() + v.shape[0]);
  T* dst = alloc(start.back(), W);
  up.enqueue(dst, size_t(start.back()) * size_t(W) * sizeof(T),
             rows_fill<T>(W, parts[0].dtype, [parts, start, rb](int64_t r) {
               size_t p = 0;
               while (r >= start[p + 1]) p++;
               return static_cast<const char*>(parts[p].data) + size_t(r - start[p]) * rb;
             }));
  return true;
}

// gate [I, H] and up [I, H] as interleave_gate_up lays them out: gate row j at 2j, up row j at 2j + 1.
template <class T, class Alloc>
bool stage_gate_up(StagedUploader& up, Alloc alloc, const TensorView& gate, const TensorView& upv) {
  if (!stages_as_is<T>(gate) || upv.dtype != gate.dtype || upv.shape != gate.shape) return false;
  const int64_t I = gate.shape[0], W = gate.shape[1];
  T* dst = alloc(2 * I, W);
  const size_t rb = size_t(W) * dtype_size(gate.dtype);
  const char* g = static_cast<const char*>(gate.data);
  const char* u = static_cast<const char*>(upv.data);
  up.enqueue(dst, size_t(2 * I * W) * sizeof(T),
             rows_fill<T>(W, gate.dtype, [g, u, rb](int64_t r) { return (r % 2 ? u : g) + size_t(r / 2) * rb; }));
  return true;
}

// Every tensor stages, in one dtype (the gate/up/down of a SwiGLU).
template <class T>
bool all_stage(std::initializer_list<const TensorView*> ts) {
  for (const TensorView* t : ts)
    if (!stages_as_is<T>(*t) || t->dtype != (*ts.begin())->dtype) return false;
  return true;
}

template <class T>
struct Swiglu {
  int I = 0;
  DeviceArray<T> w1, w2;  // [2I, H] interleaved, [H, I] (f32 mode)
  SplitWeight w1_s, w2_s; // the same, split for fp32-grade products (bf16 mode)
  bool empty() const { return I == 0; }
};

// A projection [N, K] of the attention: fp32 values (f32 mode), or split for fp32-grade products
// on the tensor cores (bf16 mode).
template <class T>
struct Proj {
  int N = 0, K = 0;
  DeviceArray<T> w;  // f32 mode
  SplitWeight s;     // bf16 mode
};

template <class T>
struct Layer {
  DeviceArray<float> in_norm, post_norm;
  DeviceArray<T> qkv, o;  // [(Hq + 2 Hkv) D, H], [H, Hq D] (f32 mode; latent attention: o [H, Hq v_head_dim])
  SplitWeight qkv_s, o_s; // the same, split (bf16 mode)
  // Latent attention (cfg.mla): [q_a_proj or q_proj ; kv_a_proj_with_mqa] fused [Na, H], q_b_proj,
  // and kv_b_proj cut per head into W_UK^T [Hq][C][nope] and W_UV [Hq][v][C] (model.cc transpose_uk).
  Proj<T> mla_a, mla_qb, mla_uk, mla_uv;
  DeviceArray<float> q_a_norm, kv_a_norm;
  DeviceArray<float> qkv_bias, q_norm, k_norm;
  bool has_bias = false, has_qk_norm = false;
  bool sparse = false;
  Swiglu<T> dense;
  RouterGpu router;
  DeviceArray<float> corr_bias;  // [E]
  bool has_corr_bias = false;
  ExpertWeightsGpu<T> experts;
  std::unique_ptr<ExpertRunner> runner;    // ExpertRunnerGpu<T>, SplitExpertRunner or Fp8ExpertRunner
  SplitExpertRunner* split_runner = nullptr;  // bf16 mode, experts not exactly bf16
  Fp8ExpertRunner* fp8_runner = nullptr;      // GpuFp8Compute::TensorCore
  Swiglu<T> shared;
  DeviceArray<float> shared_gate;  // [1, H]
  bool has_shared_gate = false;
};

template <class T>
struct GpuModel final : LanguageModel {
  static constexpr bool kBf16 = std::is_same_v<T, bf16>;
  ModelConfig cfg;
  Placement placement;
  int rank = 0;
  int H = 0, V = 0, Hq = 0, Hkv = 0, D = 0, qd = 0, kvd = 0, E = 0, K = 0;
  // Latent attention (cfg.mla.enabled()): nope, rope and v head dims, kv_lora_rank, q_lora_rank,
  // the cache row W = C + dr, the fused first projection's width Na.
  bool mla = false;
  int dn = 0, dr = 0, dv = 0, C = 0, ql = 0, W = 0, Na = 0;
  float rope_factor = 1.0f;  // YaRN's attention_factor on cos/sin
  bool rope_interleaved = false;
  int64_t k_width = 0, v_width = 0;  // values per token per layer of the K and V pools
  bool identity_placement = true;  // physical expert e is logical expert e, no replicas
  std::vector<std::unique_ptr<Layer<T>>> layers;
  DeviceArray<T> embed_w, lm_w_own;
  const T* lm_w = nullptr;
  SplitWeight lm_s;  // bf16 mode: lm_head, split
  DeviceArray<float> embed_f;  // bf16 mode, an embedding not exactly bf16: kept in fp32
  bool embed_f32 = false;
  // bf16 mode: the routed experts keep fp32 accuracy (their weights are not all exactly bf16:
  // a checkpoint stored in fp32); their rows then travel in fp32.
  bool split_experts = false;
  // GpuFp8Compute::TensorCore: the routed experts stay in e4m3 (Fp8ExpertRunner), rows in fp32.
  bool fp8_experts = false;
  DeviceArray<float> final_norm, inv_freq;
  DeviceArray<int32_t> rep_off, rep_list;
  // Scratch, grown to the largest forward seen.
  DeviceArray<float> x, hn_f, qkv, q, tmp, routed, rlog, wts, shared_out, gate, logits, ctx_f, h_f;
  DeviceArray<float> mla_a_out, qa_n, q_nope, q_cat, lat_ctx, attn_v;  // latent attention
  DeviceArray<int32_t> hrows;  // head_major_rows of the step (latent attention)
  DeviceArray<bf16> xs;  // split rows (bf16 mode)
  DeviceArray<T> hn_a, ctx, h, lm_in;
  DeviceArray<int32_t> ids, phys, sel, best_ids;
  // Routing replay (R3): every MoE layer's logical choice and combine weights of the step, layer by
  // layer ([moe layer][T][K]; wts holds the weights the same way), always written by route() --
  // so a capture is a copy after the step (no extra kernel, no sync inside the step, graphs too)
  // -- or, on a replayed step, written from the host before it and read instead of the router.
  DeviceArray<int32_t> rt_ids;
  std::vector<int> moe_index;  // layer -> its index among the MoE layers (-1: dense)
  bool replaying_ = false;     // this step's routing is the uploaded one
  DeviceArray<uint64_t> gids;
  DeviceArray<TokenSlot> slots;
  // The paged KV cache: one pool allocated once the weights are on the device,
  // [layer][block][row][kv_heads * head_dim] values (fp32, or bf16 with kv_bf16) for K and for V
  // (model/kv_pool.h keeps the books), and the block tables of the step's sequences, concatenated
  // (TokenSlot::table).
  bool kv_bf16 = false;
  DeviceArray<unsigned char> k_pool, v_pool;  // bytes
  std::unique_ptr<KvPool> pool_;
  DeviceArray<int32_t> tables;
  DeviceArray<DrawSpec> specs;  // this step's draws (forward_draw)
  DeviceArray<float> draw_lp;
  DeviceArray<int32_t> draw_ids;  // the draws' tokens (best_ids: the argmax rows', both in one step)
  DeviceArray<float> draw_norm;  // each draw's max and log-sum-exp, for its top-N (top_rows)
  DeviceArray<int32_t> top_ids;  // [draw][stride]: the draws' top-N (DrawRequest::top_n)
  DeviceArray<float> top_lp;
  // The step's inputs as the kernels read them: the arrays above (ids, gids, slots, tables, sel)
  // in an eager step, a decode graph's own input buffer (GraphEntry::in_dev) while it is captured.
  const int32_t* st_ids = nullptr;
  const uint64_t* st_gids = nullptr;
  const TokenSlot* st_slots = nullptr;
  const int32_t* st_tables = nullptr;
  const int32_t* st_sel = nullptr;
  int st_run = 1;  // the most tokens of one sequence in the step (AttnArgs::max_run)

  // Decode steps as CUDA graphs (model/cuda/decode_graphs.cuh).
  DecodeGraphs graphs{true};

  void init_shapes(const ModelConfig& c, const Placement& p, int r) {
    graphs.set(!env_off("EPMOE_CUDA_GRAPH"));
    cfg = c;
    placement = p;
    rank = r;
    H = c.hidden_size, V = c.vocab_size, Hq = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim;
    qd = Hq * D, kvd = Hkv * D, E = c.routing.num_experts, K = c.routing.top_k;
    if (c.mla.enabled()) {
      const MlaConfig& m = c.mla;
      mla = true;
      dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim, dv = m.v_head_dim, C = m.kv_lora_rank, ql = m.q_lora_rank;
      W = C + dr;
      Na = (ql > 0 ? ql : Hq * (dn + dr)) + W;
      EPMOE_ASSERT(D == dn + dr, "latent attention: head_dim is qk_nope_head_dim + qk_rope_head_dim");
    }
    k_width = mla ? W : kvd;
    v_width = mla ? 0 : kvd;
    if constexpr (kBf16) {
      auto m8 = [](int v) { return v % 8 == 0; };
      // (the K of every tensor-core product: the o projection's input is Hq * v_head_dim with MLA)
      const bool mla_ok = !mla || (m8(ql) && m8(C) && m8(dn) && m8(Hq * dv));
      if (!m8(H) || !m8(mla ? Hq * dv : qd) || !m8(c.moe_intermediate_size) || !m8(c.intermediate_size) ||
          !m8(c.shared_intermediate_size) || !mla_ok)
        throw InputError("--compute bf16 on the GPU needs hidden, head, latent and intermediate sizes that are "
                         "multiples of 8 (16-byte rows); use --compute f32 for " + c.source);
    }
    for (int e = 0; e < E; e++)
      identity_placement &= p.replicas[size_t(e)].size() == 1 && p.replicas[size_t(e)][0] == e;
    std::vector<int32_t> off{0}, list;
    for (auto& reps : p.replicas) {
      for (int s : reps) list.push_back(s);
      off.push_back(int32_t(list.size()));
    }
    rep_off.upload(off);
    rep_list.upload(list);
    // The CPU's rope (model/model_rope.h): its frequencies, factor and pairing, computed on the host.
    const Rope rope = model_rope(c);
    inv_freq.upload(rope.inv_freq);
    rope_factor = rope.attention_factor;
    rope_interleaved = rope.interleaved;
  }

  void init_experts(Layer<T>& L) {
    L.experts.H = H;
    L.experts.I = cfg.moe_intermediate_size;
    L.experts.p0 = placement.first_local(rank);
    L.experts.n_local = placement.num_local(rank);
    const size_t n = size_t(L.experts.n_local), I = size_t(L.experts.I);
    if (fp8_experts) {
      auto r = std::make_unique<Fp8ExpertRunner>();
      r->init(H, int(I), L.experts.p0, L.experts.n_local);
      L.fp8_runner = r.get();
      L.runner = std::move(r);
      return;
    }
    if (split_experts) {
      auto r = std::make_unique<SplitExpertRunner>();
      r->H = H, r->I = int(I), r->p0 = L.experts.p0, r->n_local = L.experts.n_local;
      r->reserve();
      L.split_runner = r.get();
      L.runner = std::move(r);
      return;
    }
    L.experts.w1.reserve(n * 2 * I * size_t(H));
    L.experts.w2.reserve(n * size_t(H) * I);
    L.runner = std::make_unique<ExpertRunnerGpu<T>>(L.experts);
  }

  // The KV pool, sized from the memory left once the weights are on the device.
  void init_kv(const KvOptions& kv) {
    EPMOE_ASSERT(kv.block_tokens > 0, "kv pool: block of " + std::to_string(kv.block_tokens) + " tokens");
    EPMOE_ASSERT(kv.dtype != KvDtype::Auto, "kv pool: the dtype must be resolved (engine/runtime.cc make_model)");
    kv_bf16 = kv.dtype == KvDtype::BF16;
    size_t free_b = 0, total_b = 0;
    EPMOE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    // (latent attention: one row [latent | k_rope] per token and layer, no V pool)
    const int64_t vb = int64_t(KvPages{.bf16 = kv_bf16}.value_bytes());
    const int64_t per_token = int64_t(cfg.num_layers) * (k_width + v_width) * vb;
    const int64_t tokens = kv_pool_tokens(kv, Device::Cuda, int64_t(free_b), per_token, int64_t(total_b));
    const int64_t blocks = tokens / kv.block_tokens;
    const size_t n = size_t(cfg.num_layers) * size_t(tokens);
    k_pool.reserve(n * size_t(k_width) * size_t(vb));
    if (v_width > 0) v_pool.reserve(n * size_t(v_width) * size_t(vb));
    pool_ = std::make_unique<KvPool>(blocks, kv.block_tokens, [this](int32_t src, int32_t dst) {
      // Stream-ordered before the kernels of the step whose append asked for it.
      copy_kv_block(pages(), cfg.num_layers, k_width, v_width, src, dst, stream());
    });
  }

  // The pool as the kernels see it, with this step's block tables.
  KvPages pages() {
    KvPages kp;
    kp.k = k_pool.data();
    kp.v = v_width > 0 ? v_pool.data() : nullptr;
    kp.bf16 = kv_bf16;
    kp.tables = st_tables;
    kp.blocks = pool_->total_blocks();
    kp.block_tokens = pool_->block_tokens();
    return kp;
  }

  // A staged dense weight [n, k] (bf16 mode: SplitWeight's periodic form, the values once, which
  // needs k a multiple of 64; f32 mode: the values).
  static bool dense_stages(int64_t k) { return !kBf16 || k % 64 == 0; }
  static auto plain_alloc(DeviceArray<T>& plain) {
    return [&plain](int64_t n, int64_t k) {
      plain.reserve(size_t(n) * size_t(k));
      return plain.data();
    };
  }
  static auto dense_alloc(SplitWeight& sw, DeviceArray<T>& plain) {
    return [&sw, &plain](int64_t n, int64_t k) {
      if constexpr (kBf16) return sw.alloc_periodic(int(n), int(k));
      else return plain_alloc(plain)(n, k);
    };
  }

  void set_proj(Proj<T>& p, const std::vector<float>& wf, int N, int K_) {
    EPMOE_ASSERT(wf.size() == size_t(N) * size_t(K_), "gpu weights: projection size");
    p.N = N, p.K = K_;
    if constexpr (kBf16) p.s.init(wf, N, K_);
    else p.w.upload(from_floats<T>(wf));
  }

  // Latent attention's weights (FP8 ones dequantized by to_f32: code * block scale in fp32).
  void load_mla(Layer<T>& L, const MlaWeights& mw) {
    std::vector<float> fa = to_f32(ql > 0 ? mw.q_a : mw.q);
    const std::vector<float> kva = to_f32(mw.kv_a);
    fa.insert(fa.end(), kva.begin(), kva.end());
    set_proj(L.mla_a, fa, Na, H);
    if (ql > 0) {
      set_proj(L.mla_qb, to_f32(mw.q_b), Hq * (dn + dr), ql);
      L.q_a_norm.upload(mw.q_a_norm);
    }
    L.kv_a_norm.upload(mw.kv_a_norm);
    // kv_b_proj [Hq (dn + dv), C]: head h's rows h (dn + dv) .. + dn are W_UK, the next dv W_UV.
    const std::vector<float> kvb = to_f32(mw.kv_b);
    std::vector<float> uk(size_t(Hq) * size_t(C) * size_t(dn)), uv(size_t(Hq) * size_t(dv) * size_t(C));
    for (int h = 0; h < Hq; h++) {
      const size_t r0 = size_t(h) * size_t(dn + dv);
      for (int d = 0; d < dn; d++)
        for (int c = 0; c < C; c++)
          uk[(size_t(h) * size_t(C) + size_t(c)) * size_t(dn) + size_t(d)] = kvb[(r0 + size_t(d)) * size_t(C) + size_t(c)];
      for (int e = 0; e < dv; e++)
        std::memcpy(&uv[(size_t(h) * size_t(dv) + size_t(e)) * size_t(C)], &kvb[(r0 + size_t(dn + e)) * size_t(C)],
                    sizeof(float) * size_t(C));
    }
    set_proj(L.mla_uk, uk, Hq * C, dn);
    set_proj(L.mla_uv, uv, Hq * dv, C);
  }

  // From the checkpoint.
  GpuModel(const ModelConfig& c, const Checkpoint& ckpt, const Placement& p, int r, const KvOptions& kv,
           GpuFp8Compute fp8) {
    init_shapes(c, p, r);
    ModelWeights w = load_weights(c, ckpt, p.logical_owned_by(r));
    // Declared after `w`: its pieces read the mapped tensors until finish() below.
    StagedUploader up("epmoe: weights to GPU (rank " + std::to_string(r) + ")");
    {
      const size_t experts = size_t(c.num_sparse_layers()) * size_t(p.num_local(r)) * 3 *
                             size_t(c.moe_intermediate_size) * size_t(H) * sizeof(T);
      up.expect_bytes(experts + 2 * size_t(V) * size_t(H) * sizeof(T));  // + embedding and lm_head (about)
    }
    if (fp8 == GpuFp8Compute::TensorCore) {
      // Every routed expert in e4m3 with 128-blocks of scales (a rank without experts asks the
      // config, so that every rank of a group decides alike).
      if (!c.quant.fp8 || c.quant.block != kFp8Block)
        throw InputError(c.source + ": fp8 tensor-core experts need an FP8 block-quantized checkpoint "
                         "(quantization_config fp8, 128 x 128 blocks)");
      for (const LayerWeights& lw : w.layers)
        for (const auto& [e, sw] : lw.moe.experts)
          for (const TensorView* t : {&sw.gate, &sw.up, &sw.down})
            if (!Fp8ExpertRunner::accepts(*t))
              throw InputError(c.source + ": fp8 tensor-core experts need every routed expert in F8_E4M3 with "
                               "128 x 128 block scales; " + t->name + " is " + std::string(dtype_name(t->dtype)));
      fp8_experts = true;
    }
    if (kBf16 && !fp8_experts) {
      // Experts stored in anything but bf16 keep their precision (SplitExpertRunner).
      for (const LayerWeights& lw : w.layers)
        for (const auto& [e, sw] : lw.moe.experts)
          for (const TensorView* t : {&sw.gate, &sw.up, &sw.down}) split_experts |= t->dtype != DType::BF16;
    }
    for (int l = 0; l < c.num_layers; l++) {
      const LayerWeights& lw = w.layers[size_t(l)];
      auto L = std::make_unique<Layer<T>>();
      L->in_norm.upload(lw.input_norm);
      L->post_norm.upload(lw.post_attention_norm);
      if (mla) {
        load_mla(*L, lw.attn.mla);
      } else if (!(dense_stages(H) &&
                   stage_rows<T>(up, dense_alloc(L->qkv_s, L->qkv), {lw.attn.q, lw.attn.k, lw.attn.v}))) {
        std::vector<float> qkv_h = to_f32(lw.attn.q), kf = to_f32(lw.attn.k), vf = to_f32(lw.attn.v);
        qkv_h.insert(qkv_h.end(), kf.begin(), kf.end());
        qkv_h.insert(qkv_h.end(), vf.begin(), vf.end());
        if constexpr (kBf16) L->qkv_s.init(qkv_h, qd + 2 * kvd, H);
        else L->qkv.upload(from_floats<T>(qkv_h));
      }
      if (mla || !dense_stages(qd) || !stage_rows<T>(up, dense_alloc(L->o_s, L->o), {lw.attn.o})) {
        if constexpr (kBf16) L->o_s.init(to_f32(lw.attn.o), H, mla ? Hq * dv : qd);
        else L->o.upload(from_floats<T>(to_f32(lw.attn.o)));
      }
      if (!lw.attn.q_bias.empty()) {
        std::vector<float> b = lw.attn.q_bias;
        b.insert(b.end(), lw.attn.k_bias.begin(), lw.attn.k_bias.end());
        b.insert(b.end(), lw.attn.v_bias.begin(), lw.attn.v_bias.end());
        L->qkv_bias.upload(b);
        L->has_bias = true;
      }
      if (!lw.attn.q_norm.empty()) {
        L->q_norm.upload(lw.attn.q_norm);
        L->k_norm.upload(lw.attn.k_norm);
        L->has_qk_norm = true;
      }
      L->sparse = lw.sparse;
      auto load_swiglu = [&](Swiglu<T>& s, const SwigluWeights& sw) {
        s.I = int(sw.inter());
        if (dense_stages(H) && dense_stages(s.I) && all_stage<T>({&sw.gate, &sw.up, &sw.down})) {
          const bool staged = stage_gate_up<T>(up, dense_alloc(s.w1_s, s.w1), sw.gate, sw.up) &&
                              stage_rows<T>(up, dense_alloc(s.w2_s, s.w2), {sw.down});
          EPMOE_ASSERT(staged, "gpu weights: a SwiGLU that stages did not");
          return;
        }
        if constexpr (kBf16) {
          s.w1_s.init(interleave_gate_up(sw.gate, sw.up), 2 * s.I, H);
          s.w2_s.init(to_f32(sw.down), H, s.I);
        } else {
          s.w1.upload(from_floats<T>(interleave_gate_up(sw.gate, sw.up)));
          s.w2.upload(from_floats<T>(to_f32(sw.down)));
        }
      };
      if (!lw.sparse) {
        load_swiglu(L->dense, lw.dense);
      } else {
        L->router.init(to_f32(lw.moe.router), E, H, kBf16);
        if (!lw.moe.correction_bias.empty()) {
          L->corr_bias.upload(lw.moe.correction_bias);
          L->has_corr_bias = true;
        }
        init_experts(*L);
        const size_t I = size_t(L->experts.I);
        for (int q = 0; q < L->experts.n_local; q++) {
          const int logical = p.logical_of[size_t(L->experts.p0 + q)];
          const SwigluWeights& sw = lw.moe.experts.at(logical);
          if (fp8_experts) {
            L->fp8_runner->upload(q, sw.gate, sw.up, sw.down);
            continue;
          }
          if (split_experts) {
            L->split_runner->upload(q, interleave_gate_up(sw.gate, sw.up), to_f32(sw.down));
            continue;
          }
          if (all_stage<T>({&sw.gate, &sw.up, &sw.down})) {
            // Expert q's rows of this rank's [P_local][2I][H] and [P_local][H][I].
            auto at = [&](DeviceArray<T>& arr, size_t first) {
              return [&arr, first](int64_t n, int64_t k) {
                EPMOE_ASSERT(first + size_t(n) * size_t(k) <= arr.capacity(), "gpu weights: upload past the allocation");
                return arr.data() + first;
              };
            };
            const bool staged =
                stage_gate_up<T>(up, at(L->experts.w1, size_t(q) * 2 * I * size_t(H)), sw.gate, sw.up) &&
                stage_rows<T>(up, at(L->experts.w2, size_t(q) * size_t(H) * I), {sw.down});
            EPMOE_ASSERT(staged, "gpu weights: an expert that stages did not");
            continue;
          }
          upload_at(L->experts.w1, size_t(q) * 2 * I * size_t(H), from_floats<T>(interleave_gate_up(sw.gate, sw.up)));
          upload_at(L->experts.w2, size_t(q) * size_t(H) * I, from_floats<T>(to_f32(sw.down)));
        }
        if (!lw.moe.shared.empty()) load_swiglu(L->shared, lw.moe.shared);
        if (!lw.moe.shared_gate.empty()) {
          L->shared_gate.upload(to_f32(lw.moe.shared_gate));
          L->has_shared_gate = true;
        }
      }
      layers.push_back(std::move(L));
    }
    // (a BF16 embedding is exactly bf16: it stages as stored; embed_f32 stays false)
    if (!stage_rows<T>(up, plain_alloc(embed_w), {w.embed})) {
      const std::vector<float> emb = to_f32(w.embed);
      if constexpr (kBf16) {
        for (float v : emb) embed_f32 |= __bfloat162float(__float2bfloat16_rn(v)) != v;
      }
      if (embed_f32) embed_f.upload(emb);
      else embed_w.upload(from_floats<T>(emb));
    }
    if constexpr (kBf16) {
      if (!(dense_stages(H) &&
            stage_rows<T>(up, [&](int64_t n, int64_t k) { return lm_s.alloc_periodic(int(n), int(k)); }, {w.lm_head})))
        lm_s.init(to_f32(w.lm_head), V, H);
    } else if (w.lm_head.data == w.embed.data) {
      lm_w = embed_w.data();
    } else {
      if (!stage_rows<T>(up, plain_alloc(lm_w_own), {w.lm_head}))
        lm_w_own.upload(from_floats<T>(to_f32(w.lm_head)));
      lm_w = lm_w_own.data();
    }
    final_norm.upload(w.final_norm);
    up.finish();
    pack_decode_weights();
    init_kv(kv);
  }

  // Synthesized: uniform weights with the variance of a unit-gain init, norms of one.
  GpuModel(const ModelConfig& c, const Placement& p, int r, uint64_t seed, const KvOptions& kv) {
    init_shapes(c, p, r);
    cudaStream_t s = stream();
    auto rnd = [&](auto& arr, size_t n, int fan_in) {
      arr.reserve(n);
      fill_random(arr.data(), int64_t(n), seed++, std::sqrt(3.0f / float(fan_in)), s);
    };
    auto ones = [&](DeviceArray<float>& arr, size_t n) { arr.upload(std::vector<float>(n, 1.0f)); };
    for (int l = 0; l < c.num_layers; l++) {
      auto L = std::make_unique<Layer<T>>();
      ones(L->in_norm, size_t(H));
      ones(L->post_norm, size_t(H));
      if constexpr (kBf16) {
        L->qkv_s.init_random(qd + 2 * kvd, H, seed++, std::sqrt(3.0f / float(H)), s);
        L->o_s.init_random(H, qd, seed++, std::sqrt(3.0f / float(qd)), s);
      } else {
        rnd(L->qkv, size_t(qd + 2 * kvd) * size_t(H), H);
        rnd(L->o, size_t(H) * size_t(qd), qd);
      }
      if (c.qk_norm) {
        ones(L->q_norm, size_t(D));
        ones(L->k_norm, size_t(D));
        L->has_qk_norm = true;
      }
      L->sparse = c.sparse_layer[size_t(l)];
      auto make_swiglu = [&](Swiglu<T>& sw, int I) {
        sw.I = I;
        if constexpr (kBf16) {
          sw.w1_s.init_random(2 * I, H, seed++, std::sqrt(3.0f / float(H)), s);
          sw.w2_s.init_random(H, I, seed++, std::sqrt(3.0f / float(I)), s);
        } else {
          rnd(sw.w1, size_t(2 * I) * size_t(H), H);
          rnd(sw.w2, size_t(H) * size_t(I), I);
        }
      };
      if (!L->sparse) {
        make_swiglu(L->dense, c.intermediate_size);
      } else {
        {
          std::mt19937_64 g(seed++);
          std::uniform_real_distribution<float> u(-std::sqrt(3.0f / float(H)), std::sqrt(3.0f / float(H)));
          std::vector<float> wr(size_t(E) * size_t(H));
          for (auto& v : wr) v = u(g);
          L->router.init(wr, E, H, kBf16);
        }
        init_experts(*L);
        const size_t n = size_t(L->experts.n_local), I = size_t(L->experts.I);
        fill_random(L->experts.w1.data(), int64_t(n * 2 * I * size_t(H)), seed++, std::sqrt(3.0f / float(H)), s);
        fill_random(L->experts.w2.data(), int64_t(n * size_t(H) * I), seed++, std::sqrt(3.0f / float(I)), s);
        if (c.shared_intermediate_size > 0) make_swiglu(L->shared, c.shared_intermediate_size);
      }
      layers.push_back(std::move(L));
    }
    rnd(embed_w, size_t(V) * size_t(H), 3);
    if constexpr (kBf16) {
      lm_s.init_random(V, H, seed++, std::sqrt(3.0f / float(H)), s);
    } else {
      rnd(lm_w_own, size_t(V) * size_t(H), H);
      lm_w = lm_w_own.data();
    }
    ones(final_norm, size_t(H));
    EPMOE_CUDA_CHECK(cudaStreamSynchronize(s));
    pack_decode_weights();
    init_kv(kv);
  }

  // Decode steps' projections (q/k/v, o, dense and shared MLPs) run split_gemv: their weights a
  // second time in MMA-fragment order (~the attention's and dense MLPs' bytes again; the lm_head
  // keeps the tile kernel, which streams it at ~0.8 of HBM already). Before the KV pool takes
  // what memory is left.
  void pack_decode_weights() {
    if constexpr (kBf16) {
      if (!split_gemv_enabled()) return;
      auto pack = [&](SplitWeight& w) {
        if (w.periodic) w.pack_fragments(stream());
      };
      for (auto& L : layers) {
        pack(L->qkv_s);
        pack(L->o_s);
        pack(L->dense.w1_s);
        pack(L->dense.w2_s);
        pack(L->shared.w1_s);
        pack(L->shared.w2_s);
      }
      EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
    }
  }

  T* act(DeviceArray<T>& a_bf, DeviceArray<float>& a_f) {
    if constexpr (kBf16) return a_bf.data();
    else return a_f.data();
  }

  void reserve(int64_t T_) {
    if (moe_index.size() != layers.size()) {
      moe_index.assign(layers.size(), -1);
      for (size_t l = 0, m = 0; l < layers.size(); l++)
        if (layers[l]->sparse) moe_index[l] = int(m++);
    }
    const size_t t = size_t(std::max<int64_t>(T_, 1));
    int maxI = std::max(cfg.intermediate_size, cfg.shared_intermediate_size);
    x.reserve(t * H);
    hn_f.reserve(t * H);
    if constexpr (kBf16) hn_a.reserve(t * H);
    qkv.reserve(t * size_t(qd + 2 * kvd));
    q.reserve(t * size_t(qd));
    ctx.reserve(t * size_t(qd));
    tmp.reserve(t * H);
    routed.reserve(t * H);
    rlog.reserve(t * size_t(E));
    const size_t moe_layers = size_t(std::max(cfg.num_sparse_layers(), 1));
    wts.reserve(t * size_t(K) * moe_layers);
    rt_ids.reserve(t * size_t(K) * moe_layers);
    phys.reserve(t * size_t(K));
    shared_out.reserve(t * H);
    gate.reserve(t);
    h.reserve(t * size_t(std::max(maxI, 1)));
    if constexpr (kBf16) {
      ctx_f.reserve(t * size_t(qd));
      h_f.reserve(t * size_t(std::max(maxI, 1)));
    }
    gids.reserve(t);
    ids.reserve(t);
    slots.reserve(t);
    if (mla) {
      mla_a_out.reserve(t * size_t(Na));
      qa_n.reserve(t * size_t(std::max(ql, 1)));
      q_nope.reserve(t * size_t(Hq) * size_t(dn));
      q_cat.reserve(t * size_t(Hq) * size_t(W));
      lat_ctx.reserve(t * size_t(Hq) * size_t(C));
      attn_v.reserve(t * size_t(Hq) * size_t(dv));
      hrows.reserve(t * size_t(Hq));
    }
  }

  // Dense SwiGLU on the normalised rows (act) -> out fp32 [T, H] (accumulate: out += it).
  void swiglu(const Swiglu<T>& s, const T* in, int64_t T_, float* out, bool accumulate = false) {
    if constexpr (kBf16) {  // fp32-grade on the normalised fp32 rows
      split_linear(s.w1_s, hn_f.data(), H, T_, xs, h_f.data(), nullptr, Epilogue::SwiGLU, stream());
      split_linear(s.w2_s, h_f.data(), s.I, T_, xs, out, nullptr, Epilogue::Store, stream(), accumulate);
      return;
    }
    GemmArgs g1;
    g1.A = in;
    g1.lda = H;
    g1.B = s.w1.data();
    g1.ldb = H;
    g1.M = int(T_);
    g1.N = 2 * s.I;
    g1.K = H;
    g1.C = h.data();
    g1.ldc = s.I;
    gemm<T, T>(g1, Epilogue::SwiGLU, stream());
    GemmArgs g2;
    g2.A = h.data();
    g2.lda = s.I;
    g2.B = s.w2.data();
    g2.ldb = s.I;
    g2.M = int(T_);
    g2.N = H;
    g2.K = s.I;
    g2.C = out;
    g2.ldc = H;
    g2.accumulate = accumulate;
    gemm<T, float>(g2, Epilogue::Store, stream());
  }

  // The MLP block on hn_f / act(hn): out = block(x) (accumulate: out += block(x)).
  void mlp(int l, int64_t T_, A2ABackend& backend, float* out, bool accumulate) {
    Layer<T>& L = *layers[size_t(l)];
    cudaStream_t s = stream();
    const T* xin = act(hn_a, hn_f);
    if (!L.sparse) {
      if (!accumulate || add_in_epilogue(T_)) {
        swiglu(L.dense, xin, T_, out, accumulate);
      } else {
        swiglu(L.dense, xin, T_, tmp.data());
        add_inplace(out, tmp.data(), T_ * H, s);
      }
      return;
    }
    const bool bf16_rows = kBf16 && !split_experts && !fp8_experts;
    GpuMoeOps ops(L.router, *L.runner, [&](float* y) { swiglu(L.shared, xin, T_, y); });
    ops.shared_gate = L.has_shared_gate ? L.shared_gate.data() : nullptr;
    ops.has_shared = !L.shared.empty();
    RouteArgs& ra = ops.ra;
    const int64_t slice = int64_t(moe_index[size_t(l)]) * T_ * K;
    ra.cfg = cfg.routing;
    ra.identity = identity_placement;
    ra.bias = L.has_corr_bias ? L.corr_bias.data() : nullptr;
    ra.T = T_;
    ra.gids = st_gids;
    ra.rep_off = rep_off.data();
    ra.rep_list = rep_list.data();
    ra.logical = rt_ids.data() + slice;  // [moe layer][T][K]: a capture is a copy after the step
    ra.physical = phys.data();
    ra.weights = wts.data() + slice;
    ops.replay = replaying_;
    ops.T = T_, ops.H = H, ops.K = K;
    ops.x_f32 = hn_f.data();
    ops.rows = bf16_rows ? static_cast<const void*>(xin) : static_cast<const void*>(hn_f.data());
    ops.act = bf16_rows ? DType::BF16 : DType::F32;
    ops.routed_out = routed.data(), ops.shared_out = shared_out.data(), ops.gate_out = gate.data();
    ops.s = s;
    run_moe_block(ops, backend);
    // Added into the residual x by the next layer's input norm (residual_rmsnorm, one launch
    // fewer), or here where nothing of the kind follows.
    if (accumulate && out == x.data()) pending_moe_ = ops.result;
    else moe_output(ops.result.routed, ops.result.shared, ops.result.gate_logit, T_, H, out, accumulate, s);
  }
  // A MoE layer's output not yet added into x (routed is set): residual_rmsnorm adds it.
  MoeResidual pending_moe_;
  // EPMOE_NORM_SPLITS: the input norm wrote the q/k/v projection's x fragments (split_gemv's split,
  // x_fragments.cuh), so attention_block's projection skips its x-split launch. Set by
  // attention_norm, taken by the next attention_block.
  bool qkv_x_given_ = false;
  void flush_moe(int64_t T_) {
    if (!pending_moe_.routed) return;
    moe_output(pending_moe_.routed, pending_moe_.shared, pending_moe_.gate_logit, T_, H, x.data(), true, stream());
    pending_moe_ = {};
  }

  // q/k norm + RoPE + KV-cache write on qkv, then attention into ctx (TA: the o projection's input).
  // o_frag: the o projection's x fragments for the decode kernel to write as well; returns whether
  // it did (the projection then skips its x split).
  template <class TA>
  bool rope_and_attend(Layer<T>& L, int l, int64_t T_, int max_ctx, TA* ctx_out, const XFragments& o_frag = {}) {
    cudaStream_t s = stream();
    RopeArgs ra;
    ra.qkv = qkv.data();
    ra.T = T_;
    ra.Hq = Hq;
    ra.Hkv = Hkv;
    ra.D = D;
    ra.rotary_dim = cfg.rotary_dim;
    ra.q_norm = L.has_qk_norm ? L.q_norm.data() : nullptr;
    ra.k_norm = L.has_qk_norm ? L.k_norm.data() : nullptr;
    ra.eps = cfg.rms_norm_eps;
    ra.inv_freq = inv_freq.data();
    ra.attention_factor = rope_factor;
    ra.slots = st_slots;
    ra.kv = pages();
    ra.layer = l;
    ra.q_out = q.data();
    AttnArgs aa;
    aa.rope = ra;  // (attention() runs it first, or the decode kernel does it for its own token)
    // The decode kernel does the rope of its own token where its blocks are one per SM (its 8-warp
    // shape): run 30, H100, 48 layers, one sequence 4.39 -> 4.31 ms a step. Where they queue for
    // the SMs the rope kernel stays before it: run 25 measured the fused rope there 1 % slower at
    // 8 sequences, and run 30 has no measurement of it. EPMOE_ATTN_ROPE=0: the rope kernel everywhere.
    static const bool rope_separate = env_off("EPMOE_ATTN_ROPE");
    aa.rope_separate = rope_separate || !decode_blocks_one_per_sm(T_, Hq);
    aa.slots = st_slots;
    aa.kv = ra.kv;
    aa.layer = l;
    aa.T = T_;
    aa.Hq = Hq;
    aa.Hkv = Hkv;
    aa.Dk = aa.Dv = D;
    aa.k_stride = aa.v_stride = kvd;
    aa.o_tok = qd;
    aa.o_head = D;
    aa.scale = cfg.softmax_scale();
    aa.max_ctx = max_ctx;
    aa.max_run = st_run;
    aa.o_frag = o_frag;
    return attention<TA>(aa, ctx_out, s);
  }

  // y [T, N] = x [T, K] (rows lda apart) p^T: fp32 SIMT (f32 mode) or fp32-grade split (bf16 mode).
  void linear(Proj<T>& p, const float* xin, int64_t lda, int64_t T_, float* y) {
    if constexpr (kBf16) {
      split_linear(p.s, xin, lda, T_, xs, y, nullptr, Epilogue::Store, stream());
    } else {
      GemmArgs g;
      g.A = xin;
      g.lda = lda;
      g.B = p.w.data();
      g.ldb = p.K;
      g.M = int(T_);
      g.N = p.N;
      g.K = p.K;
      g.C = y;
      g.ldc = p.N;
      gemm<float, float>(g, Epilogue::Store, stream());
    }
  }

  // The per-head products of latent attention: head h's rows of x [Hq][T][K] (head-major, rows
  // lda apart) through its N / Hq rows of p, output row (h, t) to y row t * Hq + h (hrows), ldc apart.
  void linear_heads(Proj<T>& p, const float* xin, int64_t lda, int64_t T_, float* y, int64_t ldc) {
    if constexpr (kBf16) {
      split_linear_grouped(p.s, Hq, xin, lda, T_, xs, y, ldc, hrows.data(), stream());
    } else {
      GemmArgs g;
      g.A = xin;
      g.lda = lda;
      g.B = p.w.data();
      g.ldb = p.K;
      g.b_group_stride = int64_t(p.N / Hq) * p.K;
      g.G = Hq;
      g.M = int(T_);
      g.N = p.N / Hq;
      g.K = p.K;
      g.C = y;
      g.ldc = ldc;
      g.c_rows = hrows.data();
      gemm<float, float>(g, Epilogue::Store, stream());
    }
  }

  // model.cc Model::mla_attention on the normalised rows hn_f, the absorbed form for every token:
  // the latent cache row [RMSNorm(latent) | rope(k_rope)] per token, queries [W_UK^T q_nope |
  // rope(q_rope)] per head, scores against the cache rows, the latent context through W_UV, o_proj.
  void mla_attention_block(int l, int64_t T_, int max_ctx) {
    Layer<T>& L = *layers[size_t(l)];
    cudaStream_t s = stream();
    linear(L.mla_a, hn_f.data(), H, T_, mla_a_out.data());  // [q_a or q | latent | k_rope]
    MlaLatentArgs la;
    la.a = mla_a_out.data();
    la.lda = Na;
    la.T = T_;
    la.q_lora = ql;
    la.q_width = Na - W;
    la.C = C;
    la.dr = dr;
    la.q_a_norm = ql > 0 ? L.q_a_norm.data() : nullptr;
    la.qa_out = qa_n.data();
    la.kv_a_norm = L.kv_a_norm.data();
    la.eps = cfg.mla.latent_norm_eps;
    la.inv_freq = inv_freq.data();
    la.attention_factor = rope_factor;
    la.interleaved = rope_interleaved;
    la.slots = st_slots;
    la.kv = pages();
    la.layer = l;
    mla_latent_cache(la, s);
    MlaQueryArgs qa;
    if (ql > 0) {
      linear(L.mla_qb, qa_n.data(), ql, T_, q.data());
      qa.q = q.data();
      qa.ldq = qd;
    } else {
      qa.q = mla_a_out.data();  // q_proj's rows, the first Hq (dn + dr) columns
      qa.ldq = Na;
    }
    qa.T = T_;
    qa.Hq = Hq;
    qa.dn = dn;
    qa.dr = dr;
    qa.C = C;
    qa.inv_freq = inv_freq.data();
    qa.attention_factor = rope_factor;
    qa.interleaved = rope_interleaved;
    qa.slots = st_slots;
    qa.q_nope = q_nope.data();
    qa.q_cat = q_cat.data();
    mla_queries(qa, s);
    linear_heads(L.mla_uk, q_nope.data(), dn, T_, q_cat.data(), W);  // columns 0 .. C of q_cat
    AttnArgs aa;
    aa.q = q_cat.data();
    aa.slots = st_slots;
    aa.kv = pages();
    aa.kv.v = aa.kv.k;  // the values are the latents of the same rows
    aa.layer = l;
    aa.T = T_;
    aa.Hq = Hq;
    aa.Hkv = 1;
    aa.Dk = W;
    aa.Dv = C;
    aa.k_stride = aa.v_stride = W;
    aa.q_tok = int64_t(Hq) * W;
    aa.q_head = W;
    aa.o_tok = C;  // head-major [Hq][T][C]: the per-head W_UV product's input
    aa.o_head = T_ * C;
    aa.scale = cfg.softmax_scale();
    aa.max_ctx = max_ctx;
    aa.max_run = st_run;
    attention<float>(aa, lat_ctx.data(), s);
    linear_heads(L.mla_uv, lat_ctx.data(), C, T_, attn_v.data(), dv);  // token-major [T][Hq v]
    if constexpr (kBf16) {
      split_linear(L.o_s, attn_v.data(), int64_t(Hq) * dv, T_, xs, residual_out(T_), nullptr, Epilogue::Store, s,
                   add_in_epilogue(T_));
    } else {
      GemmArgs go;
      go.A = attn_v.data();
      go.lda = Hq * dv;
      go.B = L.o.data();
      go.ldb = Hq * dv;
      go.M = int(T_);
      go.N = H;
      go.K = Hq * dv;
      go.C = residual_out(T_);
      go.ldc = H;
      go.accumulate = add_in_epilogue(T_);
      gemm<float, float>(go, Epilogue::Store, s);
    }
    residual_add(T_);
  }

  // The residual add after the o projection (add_inplace's arithmetic either way): in the GEMM's
  // epilogue for a decode step's few rows (one launch fewer), else a separate add -- in the wgmma
  // kernel's epilogue each pair's read of C waits before its store (a 48-layer decode step at 64
  // sequences measured 25.9 ms against 25.0 with the separate add).
  static bool add_in_epilogue(int64_t T_) { return T_ <= 16; }
  float* residual_out(int64_t T_) { return add_in_epilogue(T_) ? x.data() : tmp.data(); }
  void residual_add(int64_t T_) {
    if (!add_in_epilogue(T_)) add_inplace(x.data(), tmp.data(), T_ * H, stream());
  }

  void attention_block(int l, int64_t T_, int max_ctx) {
    if (mla) return mla_attention_block(l, T_, max_ctx);
    Layer<T>& L = *layers[size_t(l)];
    cudaStream_t s = stream();
    const float* bias = L.has_bias ? L.qkv_bias.data() : nullptr;
    if constexpr (kBf16) {
      split_linear(L.qkv_s, hn_f.data(), H, T_, xs, qkv.data(), bias, Epilogue::Store, s, false, qkv_x_given_);
      qkv_x_given_ = false;
      const bool o_given = rope_and_attend(L, l, T_, max_ctx, ctx_f.data(), producer_splits(L.o_s, T_));
      split_linear(L.o_s, ctx_f.data(), qd, T_, xs, residual_out(T_), nullptr, Epilogue::Store, s, add_in_epilogue(T_),
                   o_given);
      residual_add(T_);
      return;
    }
    GemmArgs g;
    g.A = act(hn_a, hn_f);
    g.lda = H;
    g.B = L.qkv.data();
    g.ldb = H;
    g.M = int(T_);
    g.N = qd + 2 * kvd;
    g.K = H;
    g.C = qkv.data();
    g.ldc = qd + 2 * kvd;
    g.bias = bias;
    gemm<T, float>(g, Epilogue::Store, s);
    rope_and_attend(L, l, T_, max_ctx, ctx.data());
    GemmArgs go;
    go.A = ctx.data();
    go.lda = qd;
    go.B = L.o.data();
    go.ldb = qd;
    go.M = int(T_);
    go.N = H;
    go.K = qd;
    go.C = residual_out(T_);
    go.ldc = H;
    go.accumulate = add_in_epilogue(T_);
    gemm<T, float>(go, Epilogue::Store, s);
    residual_add(T_);
  }

  // xo: the rows also as a projection's x fragments (attention_norm under EPMOE_NORM_SPLITS).
  void norm(const float* in, const DeviceArray<float>& w, int64_t T_, const int32_t* rows = nullptr,
            const XFragments& xo = {}) {
    if (pending_moe_.routed) {  // the previous layer's MoE output into x first, in the same launch
      EPMOE_ASSERT(in == x.data() && !rows, "gpu model: a MoE output is pending on a norm of other rows");
      if constexpr (kBf16) residual_rmsnorm<bf16>(x.data(), pending_moe_, w.data(), cfg.rms_norm_eps, T_, H, hn_f.data(), hn_a.data(), stream(), xo);
      else residual_rmsnorm<float>(x.data(), pending_moe_, w.data(), cfg.rms_norm_eps, T_, H, hn_f.data(), nullptr, stream(), xo);
      pending_moe_ = {};
      return;
    }
    if constexpr (kBf16) rmsnorm<bf16>(in, w.data(), cfg.rms_norm_eps, T_, H, rows, hn_f.data(), hn_a.data(), stream(), xo);
    else rmsnorm<float>(in, w.data(), cfg.rms_norm_eps, T_, H, rows, hn_f.data(), nullptr, stream(), xo);
  }

  // Where the kernel computing a projection's x writes it split for that projection (the one
  // EPMOE_NORM_SPLITS decision, for the norm and attention): {} where split_gemv does not take it.
  static XFragments producer_splits(const SplitWeight& W, int64_t T_) {
    return norm_splits() ? split_gemv_x_fragments(W, T_) : XFragments{};
  }

  // The input norm of layer l: unless EPMOE_NORM_SPLITS=0, a bf16 model's decode step (split_gemv
  // takes its q/k/v call) gets the norm to write the projection's x fragments -- one launch fewer
  // on the step's chain, the same values (x_fragments.cuh is the one layout).
  void attention_norm(int l, int64_t T_) {
    XFragments xo;
    if constexpr (kBf16)
      if (!mla) xo = producer_splits(layers[size_t(l)]->qkv_s, T_);
    norm(x.data(), layers[size_t(l)]->in_norm, T_, nullptr, xo);
    qkv_x_given_ = xo.xf != nullptr;
  }

  // Routing replay (ForwardOptions::replay): the given routing, checked as the CPU model checks it,
  // into rt_ids and wts ([moe layer][T][K]) before the step; the step then runs eagerly (a graph
  // holds the router's kernels) and reads it instead of the routers'.
  void upload_replay(const StepRouting& r, int64_t T_) {
    const int M = cfg.num_sparse_layers();
    if (r.moe_layers != M || r.K != K || r.tokens() != T_ || r.weights.size() != r.ids.size())
      throw InputError("routing replay: [" + std::to_string(r.tokens()) + "][" + std::to_string(r.moe_layers) + "][" +
                       std::to_string(r.K) + "] given for a step of [" + std::to_string(T_) + "][" +
                       std::to_string(M) + "][" + std::to_string(K) + "] (tokens, MoE layers, top-k)");
    std::vector<int32_t> ids_h(r.ids.size());
    std::vector<float> w_h(r.ids.size());
    for (int64_t t = 0; t < T_; t++)
      for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) {
          const size_t src = (size_t(t) * size_t(M) + size_t(m)) * size_t(K) + size_t(k);
          const size_t dst = (size_t(m) * size_t(T_) + size_t(t)) * size_t(K) + size_t(k);
          if (r.ids[src] < 0 || r.ids[src] >= E)
            throw InputError("routing replay: expert id " + std::to_string(r.ids[src]) + " is outside 0.." +
                             std::to_string(E - 1));
          ids_h[dst] = r.ids[src];
          w_h[dst] = r.weights[src];
        }
    if (!ids_h.empty()) {
      rt_ids.upload(ids_h);
      wts.upload(w_h);
    }
  }

  // Routing capture (ForwardOptions::capture): the step's routing as route() left it, after the
  // step (its results were waited for already: two copies, no synchronisation inside the step).
  void download_capture(StepRouting& c, int64_t T_) {
    const int M = cfg.num_sparse_layers();
    c.moe_layers = M;
    c.K = K;
    c.ids.assign(size_t(T_) * size_t(M) * size_t(K), -1);
    c.weights.assign(c.ids.size(), 0.0f);
    if (c.ids.empty()) return;
    const std::vector<int32_t> ids_d = rt_ids.download(c.ids.size());
    const std::vector<float> w_d = wts.download(c.ids.size());
    for (int m = 0; m < M; m++)
      for (int64_t t = 0; t < T_; t++)
        for (int k = 0; k < K; k++) {
          const size_t src = (size_t(m) * size_t(T_) + size_t(t)) * size_t(K) + size_t(k);
          const size_t dst = (size_t(t) * size_t(M) + size_t(m)) * size_t(K) + size_t(k);
          c.ids[dst] = ids_d[src];
          c.weights[dst] = w_d[src];
        }
  }

  // run() with the routing options: replay uploaded before, capture read back after.
  template <class Fn>
  void with_routing_io(const ForwardOptions& opt, const std::vector<std::vector<int32_t>>& tokens, Fn&& fn) {
    int64_t T_ = 0;
    for (const auto& t : tokens) T_ += int64_t(t.size());
    if (opt.replay) {
      reserve(T_);
      upload_replay(*opt.replay, T_);
      replaying_ = true;
    }
    struct Reset {
      bool& f;
      ~Reset() { f = false; }
    } reset{replaying_};
    fn();
    if (opt.capture) download_capture(*opt.capture, T_);
  }

  const ModelConfig& config() const override { return cfg; }
  Device device() const override { return Device::Cuda; }
  KvPool& kv_pool() override { return *pool_; }

  bool draws_on_device() const override { return true; }

  StepResult step(const StepBatch& batch, A2ABackend& backend) override {
    StepResult out;
    if (!batch.opt.check_numerics) {
      with_routing_io(batch.opt, batch.tokens, [&] { out = run(batch, backend); });
      return out;
    }
    // --check-numerics: every wanted row's logits come to the host to be checked, and an argmax is
    // taken there (the same choice: ties to the lower id on both); draws are the host's then.
    EPMOE_ASSERT(batch.draws.empty(), "step: --check-numerics checks the logits on the host, which draws");
    StepBatch host = batch;
    for (StepWant& w : host.want)
      if (w == StepWant::Argmax) w = StepWant::Logits;
    with_routing_io(batch.opt, batch.tokens, [&] { out = run(host, backend); });
    for (size_t q = 0; q < out.logits.size(); q++) {
      check_finite(out.logits[q], "logits");
      if (batch.want[q] == StepWant::Argmax && !out.logits[q].empty()) {
        out.argmax[q] = argmax(out.logits[q].data(), V);
        out.logits[q].clear();
      }
    }
    return out;
  }

  // The GPU's phases of the decoder's one layer loop (model/decoder.h): the residual stream x,
  // the normalised rows hn_f / act(hn); the o projection and small dense MLPs add into x in their
  // epilogue, a MoE output is added by the next norm.
  struct StepOps {
    GpuModel& m;
    int64_t T_;
    int max_ctx;
    A2ABackend& backend;
    void attention_norm(int l) { m.attention_norm(l, T_); }
    void attention(int l) {
      if (T_ > 0) m.attention_block(l, T_, max_ctx);  // (a rank without tokens still joins the MoE layers)
    }
    void mlp_norm(int l) { m.norm(m.x.data(), m.layers[size_t(l)]->post_norm, T_); }
    void moe(int l, int) { m.mlp(l, T_, backend, m.x.data(), /*accumulate=*/true); }
    void dense_mlp(int l) { m.mlp(l, T_, backend, m.x.data(), /*accumulate=*/true); }
    void layer_done(int) {}  // (--check-numerics checks the logits on the GPU)
  };

  // The kernels of a step: embedding, the layers, and (R > 0) the final norm of the rows st_sel
  // and lm_head into logits (reserved for R rows by the caller). Inputs through the st_ pointers;
  // no host synchronisation, no allocation once the buffers are sized: what a graph captures.
  void body(int64_t T_, int max_ctx, int64_t R, A2ABackend& backend) {
    cudaStream_t s = stream();
    pending_moe_ = {};  // (a step that threw half way leaves nothing behind)
    if (T_ > 0) {
      if (embed_f32) embed<float>(st_ids, embed_f.data(), T_, H, x.data(), s);
      else embed<T>(st_ids, embed_w.data(), T_, H, x.data(), s);
      if (mla) head_major_rows(T_, Hq, hrows.data(), s);
    }
    StepOps ops{*this, T_, max_ctx, backend};
    run_decoder_layers(cfg, ops);
    flush_moe(T_);  // (the final norm reads selected rows only)
    if (R == 0) return;
    // The rows whose logits are wanted (selected before the layers) are normalised, through lm_head.
    reserve(R);
    norm(x.data(), final_norm, R, st_sel);
    if constexpr (kBf16) {
      split_linear(lm_s, hn_f.data(), H, R, xs, logits.data(), nullptr, Epilogue::Store, s);
    } else {
      GemmArgs g;
      g.A = act(hn_a, hn_f);
      g.lda = H;
      g.B = lm_w;
      g.ldb = H;
      g.M = int(R);
      g.N = V;
      g.K = H;
      g.C = logits.data();
      g.ldc = V;
      gemm<T, float>(g, Epilogue::Store, s);
    }
  }

  // The model's own scratch addresses (what a graph holds besides the layers' and the backend's).
  std::vector<const void*> scratch_layout() const {
    return {x.data(),      hn_f.data(),   hn_a.data(),    qkv.data(),     q.data(),      ctx.data(),
            ctx_f.data(),  tmp.data(),    routed.data(),  rlog.data(),    wts.data(),    phys.data(),    rt_ids.data(),
            shared_out.data(), gate.data(), h.data(),     h_f.data(),     xs.data(),     mla_a_out.data(),
            qa_n.data(),   q_nope.data(), q_cat.data(),   lat_ctx.data(), attn_v.data(), hrows.data(),
            logits.data()};
  }
  bool graph_eligible(const std::vector<std::vector<int32_t>>& tokens, const A2ABackend& be, int64_t T_) const {
    // Only a backend that says it can be captured (graph_capturable: its waits run on the device
    // and its message sizes are fixed by a promised bound). A backend that waits on its peers from
    // the host, or sizes its messages from counts exchanged during the step, runs eagerly, always;
    // which backends those are is the ep layer's business, not the model's.
    if (!graphs.on() || T_ == 0 || !be.graph_capturable()) return false;
    for (const auto& t : tokens)
      if (t.size() != 1) return false;  // prefill and mixed steps: their shapes rarely repeat
    // The expert plan's one-block form only (the multi-block form keeps a workspace shared by
    // every model of the process, which another model could move).
    if (!plan_in_one_block(T_, std::max(K, 1), false)) return false;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    EPMOE_CUDA_CHECK(cudaStreamIsCapturing(stream(), &cs));
    return cs == cudaStreamCaptureStatusNone;
  }

  // The step through its graph: false when it is to run eagerly (the first step of its token
  // count, or graphs turned off by a failed capture).
  bool graph_step(A2ABackend& be, int64_t B, int max_ctx, const StepInputsHost& in) {
    const int cap = DecodeGraphs::ctx_bucket(max_ctx, mla ? W : D);
    auto prepare = [&] {  // buffers sized outside the capture (the logits of B rows); a move invalidates
      reserve(B);
      logits.reserve(size_t(B) * size_t(V));
      if constexpr (kBf16) xs.reserve(size_t(B) * size_t(lm_s.P) * size_t(lm_s.K));  // (lm_head's split rows)
      graphs.note_layout(scratch_layout());
      attention_prepare(mla ? W : D, cap);  // the kernel's shared-memory limit, raised outside the capture
    };
    auto record = [&](const StepInputs& d) {
      st_gids = d.gids, st_slots = d.slots, st_ids = d.ids, st_sel = d.sel, st_tables = d.tables;
      body(B, cap, B, be);
    };
    return graphs.run(uintptr_t(be.uid()), B, cap, pool_->block_tokens(), in, stream(), prepare, record);
  }

  void set_graphs(bool on) { graphs.set(on); }

  // The step: the layers, lm_head on the wanted rows only, then per row what it wants -- an argmax
  // and the draws picked on the device, only the Logits / AllLogits rows downloaded -- after one wait.
  StepResult run(const StepBatch& batch, A2ABackend& backend) {
    EPMOE_ASSERT(backend.device() == Device::Cuda, "the GPU model runs a backend of the GPU, not " + backend.name());
    const std::vector<Sequence*>& seqs = batch.seqs;
    const std::vector<std::vector<int32_t>>& tokens = batch.tokens;
    const DecoderStep st = plan_decoder_step(cfg, seqs, tokens, logit_rows_of(batch));
    const int64_t T_ = st.T();
    st_run = 1;
    for (auto& t : tokens) st_run = std::max(st_run, int(t.size()));
    reserve(T_);
    // (A copy on write is queued on the stream, before this step's kernels.)
    append_step_tokens(*pool_, seqs, tokens);
    // Each token's slot: its position and its sequence's block table (the active sequences'
    // tables, concatenated).
    std::vector<TokenSlot> slots_h(static_cast<size_t>(T_));
    std::vector<int32_t> tables_h;
    for (size_t q = 0; q < seqs.size(); q++) {
      if (tokens[q].empty()) continue;
      const std::vector<int32_t>& bt = seqs[q]->kv->blocks();
      const int table = int(tables_h.size());
      tables_h.insert(tables_h.end(), bt.begin(), bt.end());
      for (int64_t t = st.offsets[q]; t < st.offsets[q + 1]; t++) slots_h[size_t(t)] = {int(st.positions[size_t(t)]), table};
    }
    const int max_ctx = int(st.max_context);
    const std::vector<int32_t>& ids_h = st.ids;
    const std::vector<uint64_t>& gids_h = st.gids;
    // The rows whose logits are wanted (st.logit_rows). Every host-to-device copy of the step
    // happens here, while the stream is idle: a synchronous copy behind the layers would wait on
    // their collectives outside the group's deadline (a stopped peer would hang this rank instead
    // of being named). (Only the copies on write of append above may be queued before them:
    // local, no collective.)
    const std::vector<int32_t>& sel_h = st.logit_rows;
    const std::vector<std::pair<int64_t, int64_t>>& span = st.logit_span;
    // The draws (a Draw row's last logits row) and the argmax rows, as indices into the wanted rows.
    std::vector<DrawSpec> specs_h;
    bool any_argmax = false, any_logits = false;
    for (size_t q = 0; q < seqs.size(); q++) {
      if (span[q].second == 0) continue;
      any_argmax |= batch.want[q] == StepWant::Argmax;
      any_logits |= batch.want[q] == StepWant::Logits || batch.want[q] == StepWant::AllLogits;
    }
    for (const DrawRequest& d : batch.draws) {
      EPMOE_ASSERT(d.row >= 0 && size_t(d.row) < seqs.size() && batch.want[size_t(d.row)] == StepWant::Draw &&
                       span[size_t(d.row)].second > 0,
                   "step: a draw from row " + std::to_string(d.row) + ", which has no Draw logits in this step");
      EPMOE_ASSERT(d.top_n >= 0 && d.top_n <= kMaxDrawTopN,
                   "step: top_n " + std::to_string(d.top_n) + " outside [0, " + std::to_string(kMaxDrawTopN) + "]");
      specs_h.push_back({int32_t(span[size_t(d.row)].first), d.temperature, d.seed, d.position, d.top_n});
    }
    cudaStream_t s = stream();
    const int64_t R = int64_t(sel_h.size());
    if (!specs_h.empty()) specs.upload(specs_h);
    // A decode step replays its graph (uploading its inputs into the graph's own buffer); any
    // other step, or one the graph path declines, runs kernel by kernel.
    // (A graph computes lm_head for every row of the step: all of them must be wanted.)
    const bool graphed = R > 0 && R == T_ && !replaying_ && graph_eligible(tokens, backend, T_) &&
                         graph_step(backend, T_, max_ctx, StepInputsHost{gids_h, slots_h, ids_h, sel_h, tables_h});
    if (!graphed) {
      ids.upload(ids_h);
      gids.upload(gids_h);
      slots.upload(slots_h);
      tables.upload(tables_h);
      if (!sel_h.empty()) sel.upload(sel_h);
      st_ids = ids.data(), st_gids = gids.data(), st_slots = slots.data(), st_tables = tables.data();
      st_sel = sel.data();
      if (R > 0) logits.reserve(size_t(R) * size_t(V));
      body(T_, max_ctx, R, backend);
      graphs.note_eager_step(uintptr_t(backend.uid()), T_, scratch_layout());
    }
    for (size_t q = 0; q < seqs.size(); q++) seqs[q]->len += int64_t(tokens[q].size());

    StepResult out;
    out.logits.resize(seqs.size());
    out.argmax.assign(seqs.size(), -1);
    out.drawn.resize(specs_h.size());
    if (R == 0) {
      wait_stream("forward");
      return out;
    }
    // Draws, with their top-N alternatives (logprobs: N) by a second kernel over the rows that ask,
    // with the draw's normaliser: only N pairs a draw come back, not the row.
    const int n = int(specs_h.size());
    int stride = 0;
    if (n > 0) {
      draw_ids.reserve(size_t(n));
      draw_lp.reserve(size_t(n));
      for (const DrawSpec& d : specs_h) stride = std::max(stride, int(d.top_n));
      if (stride > 0) {
        draw_norm.reserve(size_t(2 * n));
        top_ids.reserve(size_t(n) * size_t(stride));
        top_lp.reserve(size_t(n) * size_t(stride));
      }
      draw_rows(logits.data(), V, specs.data(), n, draw_ids.data(), draw_lp.data(), s,
                stride > 0 ? draw_norm.data() : nullptr);
      if (stride > 0)
        top_rows(logits.data(), V, specs.data(), n, draw_norm.data(), stride, top_ids.data(), top_lp.data(), s);
    }
    if (any_argmax) {
      best_ids.reserve(size_t(R));
      argmax_rows(logits.data(), R, V, best_ids.data(), s);
    }
    wait_stream("forward: the step's outputs");
    if (n > 0) {
      const std::vector<int32_t> tok = draw_ids.download(size_t(n));
      const std::vector<float> lp = draw_lp.download(size_t(n));
      const std::vector<int32_t> tid = top_ids.download(size_t(n) * size_t(stride));
      const std::vector<float> tlp = top_lp.download(size_t(n) * size_t(stride));
      for (int d = 0; d < n; d++) {
        Drawn& dr = out.drawn[size_t(d)];
        dr = {tok[size_t(d)], lp[size_t(d)], {}};
        for (int r = 0; r < specs_h[size_t(d)].top_n; r++) {
          const size_t k = size_t(d) * size_t(stride) + size_t(r);
          if (tid[k] >= 0) dr.top.push_back({tid[k], tlp[k]});  // (-1: past a vocabulary smaller than N)
        }
      }
    }
    if (any_argmax) {
      const std::vector<int32_t> best = best_ids.download(size_t(R));
      for (size_t q = 0; q < seqs.size(); q++)
        if (span[q].second > 0 && batch.want[q] == StepWant::Argmax) out.argmax[q] = best[size_t(span[q].first)];
    }
    if (any_logits) {  // each such sequence's rows (consecutive in logits), not the others'
      for (size_t q = 0; q < seqs.size(); q++) {
        const StepWant w = batch.want[q];
        if (span[q].second == 0 || (w != StepWant::Logits && w != StepWant::AllLogits)) continue;
        out.logits[q].resize(size_t(span[q].second) * size_t(V));
        EPMOE_CUDA_CHECK(cudaMemcpy(out.logits[q].data(), logits.data() + size_t(span[q].first) * size_t(V),
                                    out.logits[q].size() * sizeof(float), cudaMemcpyDeviceToHost));
      }
    }
    return out;
  }

  void mlp_block(int l, const float* xh, int64_t T_, const uint64_t* gids_h, A2ABackend& backend, float* y) override {
    EPMOE_ASSERT(backend.device() == Device::Cuda, "the GPU model runs a backend of the GPU, not " + backend.name());
    reserve(T_);
    std::vector<float> in(xh, xh + T_ * H);
    hn_f.upload(in);
    if constexpr (kBf16) convert<bf16>(hn_f.data(), hn_a.data(), T_ * H, stream());
    gids.upload(gids_h, size_t(T_));
    st_gids = gids.data();
    mlp(l, T_, backend, x.data(), /*accumulate=*/false);
    graphs.invalidate();  // (buffers of the layers may have grown; not a step: the graph path still warms up by one)
    graphs.note_layout(scratch_layout());
    wait_stream("mlp block");
    std::vector<float> o = x.download(size_t(T_ * H));
    std::copy(o.begin(), o.end(), y);
  }
};

}  // namespace

}  // namespace epmoe::cuda

namespace epmoe {

namespace {
// A synthesized model has standard attention only (its benchmark shapes); checkpoints of every
// family run (latent attention, YaRN, FP8 weights dequantized on upload).
void refuse_synthetic(const ModelConfig& cfg) {
  if (cfg.mla.enabled())
    throw InputError(cfg.source + ": a synthesized model with multi-head latent attention (" +
                     std::string(family_name(cfg.family)) + ") is not implemented on --device cuda; load a checkpoint");
}
}  // namespace

std::unique_ptr<LanguageModel> make_gpu_model(const ModelConfig& cfg, const Checkpoint& ckpt,
                                              const Placement& placement, int rank, const GpuModelOptions& opt) {
  std::unique_ptr<LanguageModel> m;
  if (opt.f32) m = std::make_unique<cuda::GpuModel<float>>(cfg, ckpt, placement, rank, opt.kv, opt.fp8);
  else m = std::make_unique<cuda::GpuModel<cuda::bf16>>(cfg, ckpt, placement, rank, opt.kv, opt.fp8);
  if (!opt.cuda_graph) set_gpu_cuda_graph(*m, false);
  return m;
}

void set_gpu_cuda_graph(LanguageModel& m, bool on) {
  if (auto* g = dynamic_cast<cuda::GpuModel<float>*>(&m)) return g->set_graphs(on);
  if (auto* g = dynamic_cast<cuda::GpuModel<cuda::bf16>*>(&m)) return g->set_graphs(on);
  throw InputError("CUDA graphs: not a model of --device cuda");
}

GpuGraphStats gpu_graph_stats(const LanguageModel& m) {
  if (auto* g = dynamic_cast<const cuda::GpuModel<float>*>(&m)) return g->graphs.stats();
  if (auto* g = dynamic_cast<const cuda::GpuModel<cuda::bf16>*>(&m)) return g->graphs.stats();
  throw InputError("CUDA graphs: not a model of --device cuda");
}

std::unique_ptr<LanguageModel> make_gpu_model(const ModelConfig& cfg, const Checkpoint& ckpt,
                                              const Placement& placement, int rank, bool f32, const KvOptions& kv) {
  GpuModelOptions opt;
  opt.f32 = f32;
  opt.kv = kv;
  return make_gpu_model(cfg, ckpt, placement, rank, opt);
}

std::unique_ptr<LanguageModel> make_synthetic_gpu_model(const ModelConfig& cfg, const Placement& placement, int rank,
                                                        bool f32, uint64_t seed, const KvOptions& kv) {
  refuse_synthetic(cfg);
  if (f32) return std::make_unique<cuda::GpuModel<float>>(cfg, placement, rank, seed, kv);
  return std::make_unique<cuda::GpuModel<cuda::bf16>>(cfg, placement, rank, seed, kv);
}

}  // namespace epmoe
