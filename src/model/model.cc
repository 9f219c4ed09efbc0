#include "model/model.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>

#include "kernels/attention.h"
#include "kernels/latent_attention.h"
#include "kernels/matmul.h"
#include "kernels/vec.h"
#include "model/decoder.h"
#include "model/model_rope.h"
#include "moe/moe_layer.h"
#include "util/error.h"
#include "util/stage_clock.h"
#include "util/threads.h"

namespace epmoe {

namespace {

// W_UK^T per head from kv_b_proj [heads * (nope + v), kv_lora]: out[h][c][d] = kv_b[h * (nope + v) + d][c],
// dequantized to fp32 (TensorView::at: exact for every stored dtype).
std::vector<float> transpose_uk(const ModelConfig& cfg, const TensorView& kv_b) {
  const MlaConfig& m = cfg.mla;
  const int64_t C = m.kv_lora_rank, dn = m.qk_nope_head_dim, stride = m.qk_nope_head_dim + m.v_head_dim;
  std::vector<float> out(size_t(cfg.num_heads) * size_t(C) * size_t(dn));
  std::vector<float> row(static_cast<size_t>(C));
  for (int64_t h = 0; h < cfg.num_heads; h++)
    for (int64_t d = 0; d < dn; d++) {
      const int64_t r = h * stride + d;
      for (int64_t c = 0; c < C; c++) row[size_t(c)] = kv_b.at(r * C + c);
      for (int64_t c = 0; c < C; c++) out[size_t((h * C + c) * dn + d)] = row[size_t(c)];
    }
  return out;
}

}  // namespace

Model::Model(const ModelConfig& cfg, const Checkpoint& ckpt, const Placement& placement, int rank,
             ComputeMode compute, const KvOptions& kv, LmHeadForm lm_head)
    : cfg_(cfg), placement_(placement), rank_(rank), compute_(compute),
      w_(load_weights(cfg, ckpt, placement.logical_owned_by(rank), lm_head)),
      rope_(model_rope(cfg)) {
  if (cfg.mla.enabled()) {
    k_width_ = cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim;
    v_width_ = 0;
    for (const LayerWeights& L : w_.layers) uk_t_.push_back(transpose_uk(cfg, L.attn.mla.kv_b));
  } else {
    k_width_ = v_width_ = int64_t(cfg.num_kv_heads) * cfg.head_dim;
  }
  const int64_t per_token = int64_t(cfg.num_layers) * (k_width_ + v_width_) * int64_t(sizeof(float));
  const int64_t tokens = kv_pool_tokens(kv, Device::Cpu, available_memory_bytes(), per_token);
  const int64_t blocks = tokens / kv.block_tokens;
  const size_t n = size_t(cfg.num_layers) * size_t(tokens);
  k_mem_ = ReservedMemory(n * size_t(k_width_) * sizeof(float));
  if (v_width_ > 0) v_mem_ = ReservedMemory(n * size_t(v_width_) * sizeof(float));
  k_ = static_cast<float*>(k_mem_.data());
  v_ = static_cast<float*>(v_mem_.data());
  pool_ = std::make_unique<KvPool>(blocks, kv.block_tokens, [this](int32_t src, int32_t dst) {
    const size_t rows = size_t(pool_->block_tokens());
    for (int l = 0; l < cfg_.num_layers; l++) {
      std::memcpy(kv_row(k_, k_width_, l, dst, 0), kv_row(k_, k_width_, l, src, 0), rows * size_t(k_width_) * sizeof(float));
      if (v_width_ > 0)
        std::memcpy(kv_row(v_, v_width_, l, dst, 0), kv_row(v_, v_width_, l, src, 0),
                    rows * size_t(v_width_) * sizeof(float));
    }
  });
}

float* Model::kv_row(float* base, int64_t width, int layer, int32_t block, int64_t row) const {
  return base + ((int64_t(layer) * pool_->total_blocks() + block) * pool_->block_tokens() + row) * width;
}

namespace {

void check_finite(const float* x, int64_t n, const std::string& where) {
  for (int64_t i = 0; i < n; i++)
    if (!std::isfinite(x[i]))
      throw CheckError("--check-numerics: " + where + " produced " + (std::isnan(x[i]) ? "NaN" : "Inf") +
                       " (element " + std::to_string(i) + ")");
}

void add_bias(float* y, int64_t T, const std::vector<float>& b) {
  if (b.empty()) return;
  const int64_t N = int64_t(b.size());
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < N; i++) y[t * N + i] += b[size_t(i)];
}

}  // namespace

void Model::attention(int l, const std::vector<Sequence*>& seqs, const std::vector<int64_t>& offsets,
                      const float* x, int64_t T, float* out) const {
  const AttentionWeights& a = w_.layers[size_t(l)].attn;
  const int Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads, D = cfg_.head_dim;
  const int64_t qd = int64_t(Hq) * D, kvd = int64_t(Hkv) * D;
  std::optional<StageScope> stage(std::in_place, Stage::Qkv);
  float* q = buf_.q.get(size_t(T * qd));
  float* k = buf_.k.get(size_t(T * kvd));
  float* v = buf_.v.get(size_t(T * kvd));
  matmul(x, T, a.q, q, compute_);
  matmul(x, T, a.k, k, compute_);
  matmul(x, T, a.v, v, compute_);
  add_bias(q, T, a.q_bias);
  add_bias(k, T, a.k_bias);
  add_bias(v, T, a.v_bias);
  if (!a.q_norm.empty()) {
    rmsnorm(q, T * Hq, D, a.q_norm, cfg_.rms_norm_eps, q);
    rmsnorm(k, T * Hkv, D, a.k_norm, cfg_.rms_norm_eps, k);
  }

  float* ctx = buf_.ctx.get(size_t(T * qd));
  stage.reset();
  // Each sequence's new K and V rows go into its blocks (forward() made room for them), then one
  // call attends every new token of every sequence over its cache (kernels/attention.h).
  std::vector<AttentionSeq> att(seqs.size());
  std::vector<std::vector<const float*>> kblocks(seqs.size()), vblocks(seqs.size());
  const int64_t B = pool_->block_tokens();
  {
    StageScope rope_stage(Stage::Rope);
    for (size_t s = 0; s < seqs.size(); s++) {
      const Sequence& seq = *seqs[s];
      const int64_t t0 = offsets[s], n = offsets[s + 1] - offsets[s], base = seq.len;
      const std::vector<int32_t>& table = seq.kv->blocks();
      parallel_for(n, 16, [&](int64_t ib, int64_t ie) {
        for (int64_t i = ib; i < ie; i++) {
          const int64_t pos = base + i;
          rope_.apply(q + (t0 + i) * qd, Hq, k + (t0 + i) * kvd, Hkv, pos);
          std::memcpy(kv_row(k_, kvd, l, table[size_t(pos / B)], pos % B), k + (t0 + i) * kvd, sizeof(float) * size_t(kvd));
          std::memcpy(kv_row(v_, kvd, l, table[size_t(pos / B)], pos % B), v + (t0 + i) * kvd, sizeof(float) * size_t(kvd));
        }
      });
      const int64_t blocks = (base + n + B - 1) / B;
      for (int64_t b = 0; b < blocks; b++) {
        kblocks[s].push_back(kv_row(k_, kvd, l, table[size_t(b)], 0));
        vblocks[s].push_back(kv_row(v_, kvd, l, table[size_t(b)], 0));
      }
      att[s].t0 = t0;
      att[s].n = n;
      att[s].base = base;
      att[s].k = KvRows{kblocks[s].data(), B, kvd};
      att[s].v = KvRows{vblocks[s].data(), B, kvd};
    }
  }
  {
    StageScope attention_stage(Stage::Attention);
    causal_attention(AttentionDims{Hq, Hkv, D, cfg_.softmax_scale()}, att, q, ctx);
  }
  StageScope o_stage(Stage::OProj);
  matmul(ctx, T, a.o, out, compute_);
}

void Model::mla_attention(int l, const std::vector<Sequence*>& seqs, const std::vector<int64_t>& offsets,
                          const float* x, int64_t T, float* out) const {
  StageScope stage(Stage::Attention);  // the whole of MLA (projections included) as one stage
  const MlaWeights& w = w_.layers[size_t(l)].attn.mla;
  const MlaConfig& m = cfg_.mla;
  const int Hq = cfg_.num_heads;
  const int64_t dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim, dv = m.v_head_dim, C = m.kv_lora_rank;
  const int64_t qk = dn + dr, W = C + dr;  // W: one cache row, [latent | k_rope]

  // Queries [T, Hq, qk], through the q LoRA when the model has one.
  std::vector<float> q(static_cast<size_t>(T * Hq * qk));
  if (m.q_lora_rank > 0) {
    std::vector<float> qa(static_cast<size_t>(T * m.q_lora_rank));
    matmul(x, T, w.q_a, qa.data(), compute_);
    rmsnorm(qa.data(), T, m.q_lora_rank, w.q_a_norm, m.latent_norm_eps, qa.data());
    matmul(qa.data(), T, w.q_b, q.data(), compute_);
  } else {
    matmul(x, T, w.q, q.data(), compute_);
  }
  // [latent | k_rope] per token: the latent normalised, k_rope rotated; this is the cache row.
  std::vector<float> kv(static_cast<size_t>(T * W));
  matmul(x, T, w.kv_a, kv.data(), compute_);
  for (int64_t t = 0; t < T; t++) rmsnorm(&kv[size_t(t * W)], 1, C, w.kv_a_norm, m.latent_norm_eps, &kv[size_t(t * W)]);

  // Absorbed queries [T, Hq, W]: [q_nope . W_UK | q_rope], so that a score is one dot product
  // with a cache row: q_nope . (W_UK c) = (W_UK^T q_nope) . c.
  std::vector<float> qc(static_cast<size_t>(T * Hq * W));
  {
    std::vector<float> qn(static_cast<size_t>(T * dn)), ql(static_cast<size_t>(T * C));
    const std::vector<float>& uk = uk_t_[size_t(l)];
    for (int h = 0; h < Hq; h++) {
      for (int64_t t = 0; t < T; t++)
        std::memcpy(&qn[size_t(t * dn)], &q[size_t((t * Hq + h) * qk)], sizeof(float) * size_t(dn));
      TensorView ukh;
      ukh.dtype = DType::F32;
      ukh.shape = {C, dn};
      ukh.data = &uk[size_t(h * C * dn)];
      ukh.name = "W_UK^T";
      matmul(qn.data(), T, ukh, ql.data(), compute_);
      for (int64_t t = 0; t < T; t++)
        std::memcpy(&qc[size_t((t * Hq + h) * W)], &ql[size_t(t * C)], sizeof(float) * size_t(C));
    }
  }

  // The latent context of each (token, head): sum_j p_j c_j over the cache, [T, Hq, C].
  std::vector<float> ctx(static_cast<size_t>(T * Hq * C));
  const float scale = cfg_.softmax_scale();
  for (size_t s = 0; s < seqs.size(); s++) {
    Sequence& seq = *seqs[s];
    const int64_t t0 = offsets[s], n = offsets[s + 1] - offsets[s];
    const std::vector<int32_t>& table = seq.kv->blocks();
    const int64_t B = pool_->block_tokens();
    const int64_t base = seq.len;
    for (int64_t i = 0; i < n; i++) {
      const int64_t t = t0 + i;
      // Rope on the rope slice of every head's query and on the shared rope key.
      rope_.apply(&q[size_t(t * Hq * qk + dn)], Hq, base + i);
      rope_.apply(&kv[size_t(t * W + C)], 1, base + i);
      for (int h = 0; h < Hq; h++)
        std::memcpy(&qc[size_t((t * Hq + h) * W + C)], &q[size_t((t * Hq + h) * qk + dn)], sizeof(float) * size_t(dr));
      std::memcpy(kv_row(k_, W, l, table[size_t((base + i) / B)], (base + i) % B), &kv[size_t(t * W)],
                  sizeof(float) * size_t(W));
    }
    // Causal attention of each new token over the cache up to and including itself, keys in
    // position order whatever blocks hold them.
    std::vector<float> p;
    for (int64_t i = 0; i < n; i++)
      latent_attention(&qc[size_t((t0 + i) * Hq * W)], Hq, W, C, base + i + 1, B,
                       [&](int64_t blk) { return kv_row(k_, W, l, table[size_t(blk)], 0); }, scale,
                       &ctx[size_t((t0 + i) * Hq * C)], p);
  }

  // Values: each head's latent context through its W_UV rows of kv_b_proj, then o_proj.
  std::vector<float> attn(static_cast<size_t>(T * Hq * dv));
  {
    std::vector<float> ch(static_cast<size_t>(T * C)), vh(static_cast<size_t>(T * dv));
    for (int h = 0; h < Hq; h++) {
      for (int64_t t = 0; t < T; t++)
        std::memcpy(&ch[size_t(t * C)], &ctx[size_t((t * Hq + h) * C)], sizeof(float) * size_t(C));
      matmul(ch.data(), T, w.kv_b.slice_rows(h * (dn + dv) + dn, dv), vh.data(), compute_);
      for (int64_t t = 0; t < T; t++)
        std::memcpy(&attn[size_t((t * Hq + h) * dv)], &vh[size_t(t * dv)], sizeof(float) * size_t(dv));
    }
  }
  matmul(attn.data(), T, w_.layers[size_t(l)].attn.o, out, compute_);
}

void Model::mlp_block(int l, const float* x, int64_t T, const uint64_t* gids, A2ABackend& backend, float* y) {
  mlp(l, 0, x, T, gids, backend, y, ForwardOptions{});
}

void Model::mlp(int l, int moe, const float* x, int64_t T, const uint64_t* gids, A2ABackend& backend, float* y,
                const ForwardOptions& opt) {
  const LayerWeights& L = w_.layers[size_t(l)];
  if (!L.sparse) {
    StageScope stage(Stage::Dense);
    swiglu_forward(L.dense, x, T, y, compute_);
    return;
  }
  // Routing replay: this layer's slice [T][K] of the step's [T][moe_layers][K], in and out.
  const int K = cfg_.routing.top_k, M = cfg_.num_sparse_layers();
  Routing in, out;
  LayerRouting io;
  if (opt.replay) {
    const StepRouting& r = *opt.replay;
    if (r.moe_layers != M || r.K != K || r.tokens() != T || r.weights.size() != r.ids.size())
      throw InputError("routing replay: [" + std::to_string(r.tokens()) + "][" + std::to_string(r.moe_layers) + "][" +
                       std::to_string(r.K) + "] given for a step of [" + std::to_string(T) + "][" +
                       std::to_string(M) + "][" + std::to_string(K) + "] (tokens, MoE layers, top-k)");
    in.T = T, in.K = K;
    in.ids.resize(size_t(T * K));
    in.weights.resize(size_t(T * K));
    for (int64_t t = 0; t < T; t++)
      for (int k = 0; k < K; k++) {
        const size_t src = (size_t(t) * size_t(M) + size_t(moe)) * size_t(K) + size_t(k);
        in.ids[size_t(t * K + k)] = r.ids[src];
        in.weights[size_t(t * K + k)] = r.weights[src];
      }
    io.replay = &in;
  }
  if (opt.capture) io.capture = &out;
  MoeLayer(cfg_.routing, L.moe, placement_, rank_, compute_).forward(x, T, cfg_.hidden_size, gids, backend, y, io);
  if (opt.capture) {
    StepRouting& c = *opt.capture;
    for (int64_t t = 0; t < T; t++)
      for (int k = 0; k < K; k++) {
        const size_t dst = (size_t(t) * size_t(M) + size_t(moe)) * size_t(K) + size_t(k);
        c.ids[dst] = out.ids[size_t(t * K + k)];
        c.weights[dst] = out.weights[size_t(t * K + k)];
      }
  }
}

// The CPU's phases of model/decoder.h on the step's host buffers: x the residual stream, hn the
// normalised rows, tmp a block's output before it is added into x.
struct Model::StepOps {
  Model& m;
  const DecoderStep& st;
  const std::vector<Sequence*>& seqs;
  A2ABackend& backend;
  const ForwardOptions& opt;
  int64_t T, H;
  float *x, *hn, *tmp;
  const uint64_t* gids;

  void norm(const std::vector<float>& w) {
    StageScope stage(Stage::Norm);
    rmsnorm(x, T, H, w, m.cfg_.rms_norm_eps, hn);
  }
  void add_block_output() {
    StageScope stage(Stage::Residual);
    for (int64_t i = 0; i < T * H; i++) x[i] += tmp[i];
  }
  const LayerWeights& layer(int l) const { return m.w_.layers[size_t(l)]; }

  void attention_norm(int l) { norm(layer(l).input_norm); }
  void attention(int l) {
    if (m.cfg_.mla.enabled()) m.mla_attention(l, seqs, st.offsets, hn, T, tmp);
    else m.attention(l, seqs, st.offsets, hn, T, tmp);
    add_block_output();
  }
  void mlp_norm(int l) { norm(layer(l).post_attention_norm); }
  void moe(int l, int moe_index) {
    m.mlp(l, moe_index, hn, T, gids, backend, tmp, opt);
    add_block_output();
  }
  void dense_mlp(int l) {
    m.mlp(l, -1, hn, T, gids, backend, tmp, opt);
    add_block_output();
  }
  void layer_done(int l) {
    if (opt.check_numerics)
      check_finite(x, T * H, "layer " + std::to_string(l) + (layer(l).sparse ? " (MoE)" : " (dense)"));
  }
};

StepResult Model::step(const StepBatch& b, A2ABackend& backend) {
  const std::vector<Sequence*>& seqs = b.seqs;
  const std::vector<std::vector<int32_t>>& tokens = b.tokens;
  const ForwardOptions& opt = b.opt;
  if (!b.draws.empty()) throw Error("step: the cpu model draws on the host (draws_on_device() is false)");
  const int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
  std::optional<StageScope> embed(std::in_place, Stage::Embed);
  const DecoderStep st = plan_decoder_step(cfg_, seqs, tokens, logit_rows_of(b));
  const int64_t T = st.T();
  float* x = buf_.x.get(size_t(T * H));
  for (int64_t t = 0; t < T; t++) {
    TensorView row = w_.embed.slice_rows(st.ids[size_t(t)], 1);
    for (int64_t h = 0; h < H; h++) x[t * H + h] = row.at(h);
  }
  append_step_tokens(*pool_, seqs, tokens);
  embed.reset();

  if (opt.capture) {
    StepRouting& c = *opt.capture;
    c.moe_layers = cfg_.num_sparse_layers();
    c.K = cfg_.routing.top_k;
    c.ids.assign(size_t(T) * size_t(c.moe_layers) * size_t(c.K), -1);
    c.weights.assign(c.ids.size(), 0.0f);
  }
  StepOps ops{*this, st, seqs, backend, opt, T, H, x, buf_.hn.get(size_t(T * H)), buf_.tmp.get(size_t(T * H)),
              st.gids.data()};
  run_decoder_layers(cfg_, ops);
  for (size_t s = 0; s < seqs.size(); s++) seqs[s]->len += int64_t(tokens[s].size());

  // Each sequence's wanted rows (consecutive) through the final norm and lm_head; an argmax is
  // picked from its row here.
  float* hn = ops.hn;
  StepResult out;
  out.logits.resize(seqs.size());
  out.argmax.assign(seqs.size(), -1);
  for (size_t s = 0; s < seqs.size(); s++) {
    const auto [at, rows] = st.logit_span[s];
    if (rows == 0) continue;
    const int64_t first = st.logit_rows[size_t(at)];
    {
      StageScope stage(Stage::Norm);
      rmsnorm(x + first * H, rows, H, w_.final_norm, cfg_.rms_norm_eps, hn + first * H);
    }
    StageScope stage(Stage::LmHead);
    std::vector<float>& l = out.logits[s];
    l.resize(static_cast<size_t>(rows * V));
    matmul(hn + first * H, rows, w_.lm_head, l.data(), compute_);
    if (opt.check_numerics) check_finite(l.data(), rows * V, "lm_head");
    if (b.want[s] == StepWant::Argmax) {
      out.argmax[s] = argmax(l.data(), V);
      l.clear();
    }
  }
  return out;
}

}  // namespace epmoe
