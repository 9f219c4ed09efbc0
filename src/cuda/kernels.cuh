// The non-GEMM kernels of the GPU forward: routing (every strategy of RoutingConfig), the expert
// plan (grouping (row, slot) jobs by local expert), the deterministic combine, and the row-wise
// ops of the decoder (RMSNorm, embedding, q/k norm + RoPE + KV-cache append, attention).
// Each mirrors a CPU function named in its comment; the CPU code is the reference.
#pragma once

#include "cuda/common.cuh"
#include "io/hf_config.h"

namespace epmoe::cuda {

// moe/routing.cc: route(), then Placement::choose() for the replica of each slot.
struct RouteArgs {
  RoutingConfig cfg;
  const float* logits = nullptr;  // [T, E]
  const float* bias = nullptr;    // [E] correction bias or nullptr
  int64_t T = 0;
  const uint64_t* gids = nullptr;     // [T] token global ids
  const int32_t* rep_off = nullptr;   // [E + 1] replicas of logical e: rep_list[rep_off[e] .. rep_off[e+1])
  const int32_t* rep_list = nullptr;  // [P]
  bool identity = false;              // no replicas: physical = logical (the tables are not read)
  int parts = 1;                      // logits = sum of `parts` partials in order (split-K router)
  int64_t part_stride = 0;            // elements from one partial [T, E] to the next
  int32_t* logical = nullptr;         // [T, K] (may be nullptr)
  int32_t* physical = nullptr;        // [T, K]
  float* weights = nullptr;           // [T, K]
};
void route(const RouteArgs& a, cudaStream_t s);

// The plan of the local experts for a set of source rows, each with K physical ids (ids outside
// [p0, p0 + n_local) are served elsewhere and skipped). Produces, per local expert, the jobs it
// serves (offsets) with the source row (a_rows) and the output row (c_rows) of each:
//   compact = false: output row = row * K + k (slot rows of the home rank)
//   compact = true:  output row = index of (row, k) among the served jobs in (row, k) order
// (the order in which answers travel back). row_base[r] (optional, rows + 1 entries) is the
// compact index of row r's first served job. One block: rows * K up to a few 100k.
struct PlanArgs {
  const int32_t* phys = nullptr;
  int64_t phys_stride = 0;  // int32 elements between rows
  int64_t rows = 0;         // bound on the rows (host)
  const int32_t* rows_dev = nullptr;  // actual rows on the device, or nullptr (= rows)
  int K = 0;
  int p0 = 0, n_local = 0;
  bool compact = false;
  bool one_per_row = false;    // output row = row (each row has at most one served slot)
  int32_t* offsets = nullptr;  // [n_local + 1]
  int32_t* a_rows = nullptr;   // [rows * K]
  int32_t* c_rows = nullptr;   // [rows * K]
  int32_t* row_base = nullptr; // [rows + 1] or nullptr
  // Tiles of tile_m rows for the grouped GEMM (gemm.cuh): (expert, first row) pairs in expert
  // order, their count in *num_tiles. tile_m = 0: none.
  int tile_m = 0;
  int32_t* tiles = nullptr;      // [2 * plan_max_tiles(...)]
  int32_t* num_tiles = nullptr;  // [1]
};
void plan(const PlanArgs& a, cudaStream_t s);
inline int plan_max_tiles(int64_t rows, int K, int n_local, int tile_m) {
  return int(rows * K / tile_m) + n_local + 1;
}

// ep/combine.cc combine_slots: y[t] = sum_{k=0..K-1} w[t,k] * rows[t*K + k] in slot order, fp32,
// then y *= scale (scale != 1 only under an injected double-reduce fault).
// slot_pos (optional): the row of (t, k) is rows[slot_pos[t*K + k]] (answers as received).
template <class TS>
void combine_slots(const TS* rows, const int32_t* slot_pos, const float* w, int64_t T, int H, int K, float scale,
                   float* y, cudaStream_t s);

// moe/moe_layer.cc after the backend: v = routed + sigmoid(gate) * shared (gate nullptr: 1;
// shared nullptr: v = routed); out = accumulate ? out + v : v.
void moe_output(const float* routed, const float* shared, const float* gate_logit, int64_t T, int H, float* out,
                bool accumulate, cudaStream_t s);

// kernels/ops.cc rmsnorm: out = w * (x / sqrt(mean(x^2) + eps)); writes fp32 and/or act copies.
template <class TA>
void rmsnorm(const float* x, const float* w, float eps, int64_t T, int H, const int32_t* rows, float* out_f32,
             TA* out_act, cudaStream_t s);

// Embedding rows: out[t] = float(table[ids[t]]).
template <class TW>
void embed(const int32_t* ids, const TW* table, int64_t T, int H, float* out, cudaStream_t s);

// x[i] += y[i]
void add_inplace(float* x, const float* y, int64_t n, cudaStream_t s);
// Conversion of activations.
template <class TO>
void convert(const float* in, TO* out, int64_t n, cudaStream_t s);

// Per token of this forward: where its K/V rows go and its position.
struct TokenSlot {
  float* k;  // cache of layer 0 at row 0; layer l at + l * cap * kvd
  float* v;
  int pos;   // position of the token in its sequence
  int cap;   // cache rows per layer
  int first; // index of the sequence's first token in this forward (for nothing but checks)
};

// model.cc attention, the part per token: q/k RMSNorm over head_dim (when q_norm), RoPE (half
// split, first rotary_dim dims), q -> q_out, k and v appended to the cache at the token's position.
// qkv: [T, (Hq + 2 Hkv) * D] fp32 (bias already added).
struct RopeArgs {
  const float* qkv = nullptr;
  int64_t T = 0;
  int Hq = 0, Hkv = 0, D = 0, rotary_dim = 0;
  const float* q_norm = nullptr;  // [D] or nullptr
  const float* k_norm = nullptr;
  float eps = 0;
  const float* inv_freq = nullptr;  // [rotary_dim / 2]
  const TokenSlot* slots = nullptr;
  int layer = 0;
  float* q_out = nullptr;  // [T, Hq * D]
};
void qk_norm_rope_cache(const RopeArgs& a, cudaStream_t s);

// Causal attention of each token over its sequence's cache up to and including itself (GQA),
// scores scaled by 1/sqrt(D), softmax in fp32; ctx [T, Hq * D] in the activation type.
template <class TA>
void attention(const float* q, const TokenSlot* slots, int layer, int64_t T, int Hq, int Hkv, int D, int max_ctx,
               TA* ctx, cudaStream_t s);

// The fp32-accurate router on tensor cores: x . w = xh.wh + xh.wl + xl.wh with x = xh + xl and
// w = wh + wl split into bf16 (products exact in fp32, accumulation in fp32; the dropped xl.wl is
// ~2^-18 relative). As one GEMM over K' = 3H: A' = [xh | xh | xl], B' = [wh | wl | wh], cut into
// S fixed chunks of K' (a split-K that depends only on H, never on T: batch-invariant), summed in
// chunk order. router_split writes A' as [S][T][K'/S]; router_sum adds the S partials [S][T][E].
void router_split(const float* x, int64_t T, int H, int S, bf16* out, cudaStream_t s);
void router_sum(const float* part, int S, int64_t T, int E, float* out, cudaStream_t s);
// Host side: B' = [wh | wl | wh] of fp32 router weights [E, H].
std::vector<bf16> router_split_weights(const std::vector<float>& w, int E, int H);
// The number of K' chunks for hidden size H (chunks of a multiple of 8 elements).
int router_chunks(int H);

// Greedy decoding on the device: out[r] = index of the largest of logits[r, 0..V) (ties to the
// lower index, as model.cc argmax).
void argmax_rows(const float* logits, int64_t R, int V, int32_t* out, cudaStream_t s);

// Deterministic pseudo-random fill (benchmarks and synthesized models): uniform in [-scale, scale).
template <class T>
void fill_random(T* p, int64_t n, uint64_t seed, float scale, cudaStream_t s);

}  // namespace epmoe::cuda
