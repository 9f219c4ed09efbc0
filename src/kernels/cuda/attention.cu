#include "kernels/cuda/attention.cuh"
#include "util/env.h"

#include <cstdlib>
#include <string>
#include <type_traits>

#include "kernels/cuda/mma_ptx.cuh"

namespace epmoe::cuda {

namespace {

// Offset of position j's row (layer `layer`) in the K or V pool, through the sequence's block table.
__device__ __forceinline__ int64_t kv_row(const KvPages& kv, const int32_t* table, int layer, int j, int64_t kvd) {
  const int B = kv.block_tokens;
  return ((int64_t(layer) * kv.blocks + table[j / B]) * B + j % B) * kvd;
}

// One head of a token by one warp (rope_kernel's job, and the decode kernel's for its own token):
// src's D values staged in s (the warp's D floats of shared memory), RMS-normalised by w when
// given, then rotated (the first rotary_dim dims, halves) at position pos; put(i, value) for every
// dim. One body for both kernels, so their q and k have the same bits.
template <class Put>
__device__ __forceinline__ void norm_rope_head(const RopeArgs& a, const float* src, float* s, const float* w, int pos,
                                               int lane, Put put) {
  const int D = a.D;
  for (int i = lane; i < D; i += 32) s[i] = src[i];
  __syncwarp();
  if (w) {
    float ss = 0.f;
    for (int i = lane; i < D; i += 32) ss += s[i] * s[i];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / float(D) + a.eps);
    for (int i = lane; i < D; i += 32) s[i] = w[i] * (s[i] * inv);
    __syncwarp();
  }
  const int half = a.rotary_dim / 2;
  for (int i = lane; i < half; i += 32) {
    const float f = float(pos) * a.inv_freq[i];
    const float cs = cosf(f) * a.attention_factor, sn = sinf(f) * a.attention_factor;  // (* 1: exact)
    const float x0 = s[i], x1 = s[i + half];
    put(i, x0 * cs - x1 * sn);
    put(i + half, x1 * cs + x0 * sn);
  }
  for (int i = a.rotary_dim + lane; i < D; i += 32) put(i, s[i]);
}

// One warp per (token, head) over the q heads, then the k heads, then the v heads; KT the cache's
// value type.
template <class KT>
__global__ void rope_kernel(const RopeArgs a) {
  extern __shared__ float hsm[];
  pdl_wait();  // (launched with launch_pdl: nothing of an earlier kernel is touched before this)
  pdl_trigger();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int heads = a.Hq + 2 * a.Hkv, D = a.D;
  const int64_t job = int64_t(blockIdx.x) * nw + warp;
  if (job >= a.T * heads) return;
  const int64_t t = job / heads;
  const int h = int(job % heads);
  const float* src = a.qkv + t * int64_t(heads) * D + int64_t(h) * D;
  const TokenSlot slot = a.slots[t];
  const int64_t kvd = int64_t(a.Hkv) * D;
  const int64_t row = h >= a.Hq ? kv_row(a.kv, a.kv.tables + slot.table, a.layer, slot.pos, kvd) : 0;
  if (h >= a.Hq + a.Hkv) {  // v: straight into the cache
    KT* dst = static_cast<KT*>(a.kv.v) + row + int64_t(h - a.Hq - a.Hkv) * D;
    for (int i = lane; i < D; i += 32) dst[i] = from_f32<KT>(src[i]);
    return;
  }
  // q to q_out in fp32; k into the cache (rounded once there when it holds bf16).
  if (h < a.Hq) {
    float* qdst = a.q_out + t * int64_t(a.Hq) * D + int64_t(h) * D;
    norm_rope_head(a, src, hsm + size_t(warp) * D, a.q_norm, slot.pos, lane, [&](int i, float v) { qdst[i] = v; });
  } else {
    KT* kdst = static_cast<KT*>(a.kv.k) + row + int64_t(h - a.Hq) * D;
    norm_rope_head(a, src, hsm + size_t(warp) * D, a.k_norm, slot.pos, lane,
                   [&](int i, float v) { kdst[i] = from_f32<KT>(v); });
  }
}

// One block per (layer, K or V): the block's rows, src -> dst (KT: the cache's value type).
template <class KT>
__global__ void copy_kv_block_kernel(const KvPages kv, int64_t k_width, int64_t v_width, int32_t src, int32_t dst) {
  const int layer = blockIdx.x >> 1;
  const bool is_v = blockIdx.x & 1;
  KT* base = static_cast<KT*>(is_v ? kv.v : kv.k);
  const int64_t n = int64_t(kv.block_tokens) * (is_v ? v_width : k_width);
  if (n == 0 || !base) return;
  const KT* from = base + (int64_t(layer) * kv.blocks + src) * n;
  KT* to = base + (int64_t(layer) * kv.blocks + dst) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) to[i] = from[i];
}

// One block per (token, q head): scores over the context in shared memory, softmax, then each
// thread one output dim as a sequential sum over the context (fixed order: batch-invariant, and
// position order 0..pos whatever blocks hold the keys: the bits do not depend on the layout).
template <class TA, class KT>
__global__ void attention_kernel(const AttnArgs a, TA* ctx) {
  extern __shared__ float asm_[];
  __shared__ float scratch[32];
  pdl_wait();  // (launched with launch_pdl: nothing of an earlier kernel is touched before this)
  pdl_trigger();
  const KvPages& kv = a.kv;
  const int Hq = a.Hq, Dk = a.Dk, Dv = a.Dv;
  const int64_t t = blockIdx.x / Hq;
  const int h = blockIdx.x % Hq, hk = h / (Hq / a.Hkv);
  const TokenSlot slot = a.slots[t];
  const int32_t* table = kv.tables + slot.table;
  const KT* kc = static_cast<const KT*>(kv.k) + int64_t(hk) * Dk;
  const KT* vc = static_cast<const KT*>(kv.v) + int64_t(hk) * Dv;
  const int B = kv.block_tokens;
  const int n = slot.pos + 1;
  const float* qh = a.q + t * a.q_tok + int64_t(h) * a.q_head;
  float* qs = asm_;      // [Dk]
  float* p = asm_ + Dk;  // [n]
  for (int i = threadIdx.x; i < Dk; i += blockDim.x) qs[i] = qh[i];
  __syncthreads();
  const float scale = a.scale;
  // Scores: one warp per key, lanes over the head dims (coalesced rows of K), a fixed-order tree.
  // A warp takes four keys at a time so that their loads (the block table, then the rows) are in
  // flight together; each key's sum is still its own chain in the same order.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  constexpr int KU = 4;
  float m = -INFINITY;
  for (int j0 = warp; j0 < n; j0 += KU * nw) {
    const KT* kj[KU];
#pragma unroll
    for (int u = 0; u < KU; u++) {
      const int j = j0 + u * nw;
      kj[u] = kc + kv_row(kv, table, a.layer, j < n ? j : j0, a.k_stride);
    }
    float d[KU] = {};
    for (int i = lane; i < Dk; i += 32)
#pragma unroll
      for (int u = 0; u < KU; u++) d[u] += qs[i] * to_f32(kj[u][i]);
#pragma unroll
    for (int u = 0; u < KU; u++) {
      const int j = j0 + u * nw;
      const float dj = warp_sum(d[u]) * scale;
      if (j < n) {
        if (lane == 0) p[j] = dj;
        m = fmaxf(m, dj);
      }
    }
  }
  m = block_max(m, scratch);  // (its barriers also publish p[])
  float sum = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    p[j] = expf(p[j] - m);
    sum += p[j];
  }
  sum = block_sum(sum, scratch);
  const float inv = 1.0f / sum;
  __syncthreads();
  for (int i = threadIdx.x; i < Dv; i += blockDim.x) {
    float o = 0.f;
    // Block by block, row by row: still j = 0, 1, ..., n - 1 in turn.
    for (int j0 = 0; j0 < n; j0 += B) {
      const KT* vb = vc + kv_row(kv, table, a.layer, j0, a.v_stride) + i;
      const int rows = min(B, n - j0);
      int r = 0;
      for (; r + 8 <= rows; r += 8) {  // eight rows' loads in flight, then their terms in order
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = to_f32(vb[int64_t(r + u) * a.v_stride]);
#pragma unroll
        for (int u = 0; u < 8; u++) o += (p[j0 + r + u] * inv) * v[u];
      }
      for (; r < rows; r++) o += (p[j0 + r] * inv) * to_f32(vb[int64_t(r) * a.v_stride]);
    }
    ctx[t * a.o_tok + int64_t(h) * a.o_head + i] = from_f32<TA>(o);
  }
}

// ---------------------------------------------------------------------------------------------
// Attention with shared K/V tiles (docs/gpu.md): one block per (tile of TQ query tokens, kv head,
// Gs q heads of its group). Tiles of 64 K (then V) rows are staged in shared memory once for all
// TQ * Gs queries of the block, instead of every (token, head) reading them from L2. Every query
// row keeps the bits of attention_kernel above: each score is the same per-lane chain over dims
// lane + 32 t and the same xor tree, the softmax sum is the same 128 per-thread partial sums and
// the same block_sum tree, and each output dim the same sequential sum over j = 0 .. pos.

constexpr int kAttnThreads = 256;  // 8 warps
constexpr int kAttnRows = 64;      // K or V rows per staged tile

// QW sums across the lanes of a warp at once, each with warp_sum's tree: the recursive halving
// exchanges at offsets 16, 8, ... pair the same lanes (l, l ^ off) in the same order as the xor
// butterfly, so sum k gets the same bits; it costs QW - 1 + 5 - log2 QW shuffles instead of
// 5 QW. Lane l ends with sum number l >> (5 - log2 QW).
template <int QW>
__device__ __forceinline__ float warp_sums(float (&v)[QW], int lane) {
  int off = 16;
#pragma unroll
  for (int c = QW; c > 1; c >>= 1, off >>= 1) {
    const bool up = lane & off;
#pragma unroll
    for (int k = 0; k < c / 2; k++) {
      const float send = up ? v[k] : v[k + c / 2];
      const float keep = up ? v[k + c / 2] : v[k];
      v[k] = keep + __shfl_xor_sync(0xffffffffu, send, off);
    }
  }
  float r = v[0];
  for (; off > 0; off >>= 1) r += __shfl_xor_sync(0xffffffffu, r, off);
  return r;
}

// Four consecutive cache values as fp32: one 16-byte load of fp32, one 8-byte load of bf16.
__device__ __forceinline__ float4 load4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float4 load4(const bf16* p) {
  const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
  // bf16 -> fp32 is the value's 16 bits in the high half of the word: exact.
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                     __uint_as_float(u.y & 0xffff0000u));
}

// A tile of kAttnRows rows (W4 groups of 4 values wide) of a K or V pool: loaded into registers as
// fp32 (so that the next tile's loads are in flight while the block works on the current one),
// then stored to shared memory [row][W4] float4s.
struct TileRegs {
  static constexpr int kChunks = kAttnRows * 32 / kAttnThreads;  // rows of up to 128 values
  float4 buf[kChunks];
  template <class KT>
  __device__ __forceinline__ void load(const KT* base, int64_t stride, int W4, const KvPages& kv,
                                       const int32_t* table, int layer, int j0, int nmax) {
#pragma unroll
    for (int c = 0; c < kChunks; c++) {
      const int idx = threadIdx.x + c * kAttnThreads;
      if (idx < kAttnRows * W4) {
        const int j = j0 + idx / W4;
        if (j < nmax) buf[c] = load4(base + kv_row(kv, table, layer, j, stride) + 4 * (idx % W4));
      }
    }
  }
  __device__ __forceinline__ void store(float4* tile, int W4) const {
#pragma unroll
    for (int c = 0; c < kChunks; c++) {
      const int idx = threadIdx.x + c * kAttnThreads;
      if (idx < kAttnRows * W4) tile[idx] = buf[c];
    }
  }
};

// The V pass of attention_tiled_kernel for the tokens r0 .. r1 - 1 of the tile: thread -> 4 dims
// (d4) of QA queries (block queries qs0 + k QS), each a sequential sum over j = 0 .. pos in order
// of w_j * v_j (w_j = p_j * inv, as attention_kernel's terms). tr holds the first V tile's loads.
template <class TA, int QA, class KT>
__device__ __forceinline__ void attention_v_pass(const AttnArgs& a, TA* ctx, TileRegs& tr, float4* tile,
                                                 const float* S, int ncap, const KT* vbase, const int32_t* table,
                                                 int nmax, int Gs, int Qb, int64_t t0, int h0, int r0, int r1) {
  const int DV4 = a.Dv / 4, QS = kAttnThreads / DV4, d4 = threadIdx.x % DV4, qs0 = threadIdx.x / DV4;
  int nq[QA];
  float4 o[QA];
#pragma unroll
  for (int k = 0; k < QA; k++) {
    const int ql = qs0 + k * QS, tk = ql / Gs;
    nq[k] = ql < Qb && tk >= r0 && tk < r1 ? a.slots[t0 + tk].pos + 1 : 0;
    o[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (int j0 = 0; j0 < nmax; j0 += kAttnRows) {
    __syncthreads();  // (the scores and the previous tile)
    tr.store(tile, DV4);
    __syncthreads();
    if (j0 + kAttnRows < nmax) tr.load(vbase, a.v_stride, DV4, a.kv, table, a.layer, j0 + kAttnRows, nmax);
    const int rows = min(kAttnRows, nmax - j0);
    for (int r = 0; r < rows; r++) {
      const int j = j0 + r;
      const float4 v = tile[r * DV4 + d4];
#pragma unroll
      for (int k = 0; k < QA; k++)
        if (j < nq[k]) {
          const float w = S[int64_t(qs0 + k * QS) * ncap + j];
          o[k].x += w * v.x;
          o[k].y += w * v.y;
          o[k].z += w * v.z;
          o[k].w += w * v.w;
        }
    }
  }
#pragma unroll
  for (int k = 0; k < QA; k++)
    if (nq[k] > 0) {
      const int ql = qs0 + k * QS;
      TA* out = ctx + (t0 + ql / Gs) * a.o_tok + int64_t(h0 + ql % Gs) * a.o_head + 4 * d4;
      out[0] = from_f32<TA>(o[k].x);
      out[1] = from_f32<TA>(o[k].y);
      out[2] = from_f32<TA>(o[k].z);
      out[3] = from_f32<TA>(o[k].w);
    }
}

// NT = Dk / 32 (the per-lane chain's length), QW = queries per warp in the score pass (QW q heads
// of one token). Dynamic shared memory: the tile [kAttnRows][max(Dk, Dv)], then the scores
// [TQ * Gs][ncap] (block query ql = token-in-tile * Gs + head-in-block).
template <class TA, class KT, int NT, int QW>
__global__ void __launch_bounds__(kAttnThreads, 2)
    attention_tiled_kernel(const AttnArgs a, TA* ctx, int Gs, int TQ, int ncap) {
  extern __shared__ float4 tsm[];
  pdl_wait();  // (launched with launch_pdl: nothing of an earlier kernel is touched before this)
  pdl_trigger();
  constexpr int Dk = NT * 32;
  constexpr int LQ = QW == 8 ? 3 : QW == 4 ? 2 : QW == 2 ? 1 : 0;
  const KvPages& kv = a.kv;
  const int Dv = a.Dv, DV4 = Dv / 4;
  float4* tile = tsm;
  float* S = reinterpret_cast<float*>(tsm + kAttnRows * (Dk > Dv ? Dk : Dv) / 4);
  const int G = a.Hq / a.Hkv, subs = G / Gs;
  const int sub = blockIdx.x % subs, hk = (blockIdx.x / subs) % a.Hkv;
  const int64_t t0 = int64_t(blockIdx.x / (subs * a.Hkv)) * TQ;
  const int ntok = int(min(int64_t(TQ), a.T - t0));
  const int h0 = hk * G + sub * Gs;  // the block's first q head
  const int Qb = TQ * Gs;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // Score pass: warp -> (query group g of QW heads of one token, one of SPG warps on its keys).
  const int QG = Qb / QW, SPG = (kAttnThreads / 32) / QG;
  const int g = warp % QG, gsub = warp / QG;
  const int gtok = g * QW / Gs, gh = (g * QW) % Gs;
  const KT* kbase = static_cast<const KT*>(kv.k) + int64_t(hk) * Dk;
  const KT* vbase = static_cast<const KT*>(kv.v) + int64_t(hk) * Dv;
  // The tile's tokens in runs of one block table (one sequence: the same K/V rows), one run after
  // the other (a tile of a prefill is one run; a tile across two sequences' chunks is two).
  for (int r0 = 0; r0 < ntok;) {
    const int tab = a.slots[t0 + r0].table;
    int r1 = r0 + 1, nmax = a.slots[t0 + r0].pos + 1;
    while (r1 < ntok && a.slots[t0 + r1].table == tab) nmax = max(nmax, a.slots[t0 + r1++].pos + 1);
    const int32_t* table = kv.tables + tab;
    const bool gact = gtok >= r0 && gtok < r1;
    const int gn = gact ? a.slots[t0 + gtok].pos + 1 : 0;
    float qr[QW][NT];
#pragma unroll
    for (int u = 0; u < QW; u++) {
      const float* qp = a.q + (t0 + gtok) * a.q_tok + int64_t(h0 + gh + u) * a.q_head;
#pragma unroll
      for (int i = 0; i < NT; i++) qr[u][i] = gact ? qp[lane + 32 * i] : 0.f;
    }
    TileRegs tr;
    tr.load(kbase, a.k_stride, Dk / 4, kv, table, a.layer, 0, nmax);
    for (int j0 = 0; j0 < nmax; j0 += kAttnRows) {
      __syncthreads();  // (the previous tile, or the previous run's V pass, is done with `tile`)
      tr.store(tile, Dk / 4);
      __syncthreads();
      if (j0 + kAttnRows < nmax) tr.load(kbase, a.k_stride, Dk / 4, kv, table, a.layer, j0 + kAttnRows, nmax);
      if (!gact) continue;
      const float* kt = reinterpret_cast<const float*>(tile);
      for (int r = gsub; r < kAttnRows; r += SPG) {
        const int j = j0 + r;
        if (j >= gn) break;
        float d[QW];
#pragma unroll
        for (int u = 0; u < QW; u++) d[u] = 0.f;
#pragma unroll
        for (int i = 0; i < NT; i++) {  // attention_kernel's chain: dims lane + 32 i in turn
          const float kx = kt[r * Dk + lane + 32 * i];
#pragma unroll
          for (int u = 0; u < QW; u++) d[u] += qr[u][i] * kx;
        }
        const float sc = warp_sums<QW>(d, lane) * a.scale;
        if ((lane & ((32 >> LQ) - 1)) == 0) S[int64_t(g * QW + (lane >> (5 - LQ))) * ncap + j] = sc;
      }
    }
    // (The first V tile's loads, in flight during the softmax: nothing in them depends on it.)
    tr.load(vbase, a.v_stride, DV4, kv, table, a.layer, 0, nmax);
    __syncthreads();
    // Softmax: one warp per query, playing attention_kernel's 128 threads: lane l holds the
    // partial sums of threads l, l + 32, l + 64, l + 96 (keys j = tid, tid + 128, ... in order),
    // warp_sum of each is that warp's sum, then block_sum's second warp_sum over the four.
    for (int ql = warp; ql < Qb; ql += kAttnThreads / 32) {
      const int tk = ql / Gs;
      if (tk < r0 || tk >= r1) continue;
      const int n = a.slots[t0 + tk].pos + 1;
      float* p = S + int64_t(ql) * ncap;
      float m = -INFINITY;
      for (int j = lane; j < n; j += 32) m = fmaxf(m, p[j]);
      m = warp_max(m);  // (a maximum: the same value whatever the order)
      float part[4] = {0.f, 0.f, 0.f, 0.f};
      for (int jb = 0; jb < n; jb += 128)
#pragma unroll
        for (int w = 0; w < 4; w++) {
          const int j = jb + 32 * w + lane;
          if (j < n) {
            p[j] = expf(p[j] - m);
            part[w] += p[j];
          }
        }
      float tot[4];
#pragma unroll
      for (int w = 0; w < 4; w++) tot[w] = warp_sum(part[w]);
      float t = lane == 0 ? tot[0] : lane == 1 ? tot[1] : lane == 2 ? tot[2] : lane == 3 ? tot[3] : 0.f;
      t = warp_sum(t);
      const float inv = 1.0f / t;
      for (int j = lane; j < n; j += 32) p[j] = p[j] * inv;  // attention_kernel's p[j] * inv
    }
    // V pass: thread -> 4 dims (d4) of up to 8 queries (as many as the block's queries need).
    const int QS = kAttnThreads / DV4, qa = (Qb + QS - 1) / QS;
    if (qa <= 1) attention_v_pass<TA, 1, KT>(a, ctx, tr, tile, S, ncap, vbase, table, nmax, Gs, Qb, t0, h0, r0, r1);
    else if (qa <= 2) attention_v_pass<TA, 2, KT>(a, ctx, tr, tile, S, ncap, vbase, table, nmax, Gs, Qb, t0, h0, r0, r1);
    else if (qa <= 4) attention_v_pass<TA, 4, KT>(a, ctx, tr, tile, S, ncap, vbase, table, nmax, Gs, Qb, t0, h0, r0, r1);
    else attention_v_pass<TA, 8, KT>(a, ctx, tr, tile, S, ncap, vbase, table, nmax, Gs, Qb, t0, h0, r0, r1);
    r0 = r1;
  }
}

// ---------------------------------------------------------------------------------------------
// Attention for decode steps of a few sequences (docs/gpu.md, issue 33): one block of NW warps per
// (token, q head), as attention_kernel, so a one-sequence step still spreads over Hq SMs (the tiled
// kernel gives it Hkv blocks). The K rows, then the V rows, of the token's sequence stream through
// STG shared-memory tiles of kAttnRows rows with cp.async -- one flat sequence of tiles, so the
// first V tiles are in flight while the last scores and the softmax are computed. The tiles never
// hold the token's own row (the kernel before writes it): they can all be requested before the
// PDL wait, and the own row comes in after it, straight from the pool (or from the fused rope).
// The bits are attention_kernel's: each score is the per-lane chain over dims lane + 32 i and
// warp_sum's tree (warp_sums: four or eight keys a warp at once; which warp takes a key does not
// enter it), the softmax attention_kernel's 128 threads' partial sums over j = tid, tid + 128, ...
// and block_sum (the other warps add exact zeros), each output dim the same sequential sum over
// j = 0 .. pos.
//
// NW warps, STG stages: decode_shape (below) -- 8 and 8 where the blocks are one per SM (a
// one-sequence step gives the kernel 32 blocks on 132 SMs, so a block's latency is the kernel's),
// the shape before run 30, 4 and 4, where they queue for the SMs.

constexpr int kDecSumThreads = 128;  // attention_kernel's block: its softmax sums are per thread

template <int NTH, class KT>
__device__ __forceinline__ void decode_stage_tile(KT* dst, const KT* base, int64_t stride, int D, const KvPages& kv,
                                                  const int32_t* table, int layer, int j0, int n) {
  const int cpr = D * int(sizeof(KT)) / 16;  // 16-byte chunks per row
  for (int idx = threadIdx.x; idx < kAttnRows * cpr; idx += NTH) {
    const int r = idx / cpr, c = idx - r * cpr, j = j0 + r;
    const KT* src = j < n ? base + kv_row(kv, table, layer, j, stride) + c * (16 / int(sizeof(KT))) : base;
    ptx::cp_async16(dst + r * D + c * (16 / int(sizeof(KT))), src, j < n ? 16 : 0);
  }
}

// ROPE (a.rope given): the kernel also does rope_kernel's work for its own token -- q of its head,
// k and v of its kv head from the projection's rows a.rope.qkv, norm_rope_head's arithmetic -- and
// puts the token's k and v rows into its staged tiles itself, instead of reading back what the rope
// kernel wrote (one launch fewer on a decode step's chain). The first q head of each kv head's
// group writes the rows to the cache for the steps after; no block of this launch reads them there.
template <class TA, class KT, int NT, bool ROPE, int NW, int STG>
__global__ void __launch_bounds__(NW * 32) attention_decode_kernel(const AttnArgs a, TA* ctx) {
  constexpr int NTH = NW * 32;
  static_assert(NTH >= kDecSumThreads && NW >= 3, "decode attention: attention_kernel's 128 sum threads, rope's 3 warps");
  extern __shared__ __align__(16) unsigned char dsm[];
  __shared__ float scratch[32];
  constexpr int D = NT * 32;  // Dk = Dv
  static_assert(D <= NTH, "decode attention: a thread per dim of the own row");
  KT* tiles = reinterpret_cast<KT*>(dsm);  // [STG][kAttnRows][D]
  float* p = reinterpret_cast<float*>(dsm + size_t(STG) * kAttnRows * D * sizeof(KT));  // [max_ctx]
  // ROPE: the token's q (fp32) and its k and v rows (KT: as the cache holds them), and two warps'
  // staging rows for norm_rope_head.
  __shared__ float own_q[ROPE ? D : 1], stage[ROPE ? 2 * D : 1];
  __shared__ KT own_k[ROPE ? D : 1], own_v[ROPE ? D : 1];
  if (blockIdx.x >= a.T * a.Hq) {  // (blocks past the T * Hq: a.o_frag's zero rows past T)
    pdl_wait();
    pdl_trigger();
    return zero_fragment_row(a.o_frag, int(a.T + (blockIdx.x - a.T * a.Hq)), a.Hq * D);
  }
  // Before the wait only the step's inputs (slots, block tables: copied in before the step's first
  // kernel) and, with a.early_tiles, K/V rows of earlier positions (below): every sequence has one
  // token here (max_run 1), whose row, at slot.pos, the kernel before (rope) writes -- or, ROPE,
  // this kernel itself after the wait.
  const KvPages& kv = a.kv;
  const int64_t t = blockIdx.x / a.Hq;
  const int h = blockIdx.x % a.Hq, hk = h / (a.Hq / a.Hkv);
  const TokenSlot slot = a.slots[t];
  const int32_t* table = kv.tables + slot.table;
  const KT* kbase = static_cast<const KT*>(kv.k) + int64_t(hk) * D;
  const KT* vbase = static_cast<const KT*>(kv.v) + int64_t(hk) * D;
  const int n = slot.pos + 1, nk = (n + kAttnRows - 1) / kAttnRows, total = 2 * nk;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Tile f of the flat sequence: K tile f, then V tile f - nk; one commit group each (empty past
  // the end, so that the wait below counts groups the same way to the last tile). The own row
  // (position n - 1) is never read into a tile (zero-filled, then overwritten below).
  auto issue = [&](int f) {
    if (f < total) {
      const bool is_k = f < nk;
      decode_stage_tile<NTH>(tiles + size_t(f % STG) * kAttnRows * D, is_k ? kbase : vbase,
                             is_k ? a.k_stride : a.v_stride, D, kv, table, a.layer, (is_k ? f : f - nk) * kAttnRows,
                             n - 1);
    }
    ptx::cp_async_commit();
  };
  // a.early_tiles: the first STG - 1 tiles while the kernels before still run, the rest after the
  // wait. What makes the early reads safe is an ordering, not this kernel: before its wait, a
  // kernel is only known to run after its predecessor triggered, and the kernels of the step that
  // trigger only after their own wait (RMSNorm; the x split where EPMOE_NORM_SPLITS=0) have every
  // earlier kernel complete by then -- the copy-on-write block copy queued before the step included
  // (kv_pool.h), the one kernel that writes rows of earlier positions. (The q/k/v split_gemv
  // between the norm and this kernel triggers early, but only after the norm triggered.) A kernel
  // between the copy and the first attention that triggers before its wait at every layer would
  // break it (run 22's early triggers, reverted, would have).
  int issued = 0;
  while (a.early_tiles && issued < STG - 1) issue(issued++);
  pdl_wait();  // (launched with launch_pdl: nothing an earlier kernel of the step writes is touched before this)
  pdl_trigger();
  while (issued < STG - 1) issue(issued++);
  const int own_k_tile = (n - 1) / kAttnRows, own_row = (n - 1) % kAttnRows;
  // Not ROPE: thread i < D holds dim i of the own K and V rows, loaded now, first used at their
  // tiles (the last K tile, the last V tile), so their latency hides behind the earlier tiles.
  KT own_k_reg{}, own_v_reg{};
  if constexpr (ROPE) {
    // rope_kernel's three jobs for this block: warp 0 its q head, warp 1 the k row, warp 2 the v row.
    const RopeArgs& r = a.rope;
    const int heads = a.Hq + 2 * a.Hkv;
    const float* src = r.qkv + t * int64_t(heads) * D;
    const bool writes = h % (a.Hq / a.Hkv) == 0;  // the group's first q head writes the cache rows
    const int64_t row = writes ? kv_row(kv, table, a.layer, slot.pos, a.k_stride) : 0;
    if (warp == 0) {
      norm_rope_head(r, src + int64_t(h) * D, stage, r.q_norm, slot.pos, lane, [&](int i, float v) { own_q[i] = v; });
    } else if (warp == 1) {
      KT* kdst = static_cast<KT*>(kv.k) + row + int64_t(hk) * D;
      norm_rope_head(r, src + int64_t(a.Hq + hk) * D, stage + D, r.k_norm, slot.pos, lane, [&](int i, float v) {
        own_k[i] = from_f32<KT>(v);
        if (writes) kdst[i] = own_k[i];
      });
    } else if (warp == 2) {
      const float* vs = src + int64_t(a.Hq + a.Hkv + hk) * D;
      KT* vdst = static_cast<KT*>(kv.v) + row + int64_t(hk) * D;
      for (int i = lane; i < D; i += 32) {
        own_v[i] = from_f32<KT>(vs[i]);
        if (writes) vdst[i] = own_v[i];
      }
    }
    __syncthreads();
  } else if (tid < D) {
    own_k_reg = kbase[kv_row(kv, table, a.layer, slot.pos, a.k_stride) + tid];
    own_v_reg = vbase[kv_row(kv, table, a.layer, slot.pos, a.v_stride) + tid];
  }
  float qr[NT];
  const float* qh = ROPE ? own_q : a.q + t * a.q_tok + int64_t(h) * a.q_head;
#pragma unroll
  for (int i = 0; i < NT; i++) qr[i] = qh[lane + 32 * i];
  float m = -INFINITY, inv = 0.f;
  float o[NT];  // thread -> dims threadIdx.x + NTH u (attention_kernel's loop over i)
#pragma unroll
  for (int u = 0; u < NT; u++) o[u] = 0.f;
  // Scores: each warp RPW rows of a tile, QG at a time.
  constexpr int RPW = kAttnRows / NW, QG = RPW < 8 ? RPW : 8, LQ = QG == 8 ? 3 : QG == 4 ? 2 : 1;
  static_assert(QG == 2 || QG == 4 || QG == 8, "decode attention: keys per warp_sums");
  for (int f = 0; f < total; f++) {
    ptx::cp_async_wait<STG - 2>();
    __syncthreads();  // tile f is in for every thread; tile f - 1 is done with (its stage refills)
    issue(f + STG - 1);
    KT* tile = tiles + size_t(f % STG) * kAttnRows * D;
    if (f == own_k_tile || f == nk + own_k_tile) {  // the token's own row, loaded or computed above
      if constexpr (ROPE) {
        const KT* own = f < nk ? own_k : own_v;
        for (int i = tid; i < D; i += NTH) tile[own_row * D + i] = own[i];
      } else if (tid < D) {
        tile[own_row * D + tid] = f < nk ? own_k_reg : own_v_reg;
      }
      __syncthreads();
    }
    if (f < nk) {
      const int j0 = f * kAttnRows;
#pragma unroll
      for (int g = 0; g < RPW / QG; g++) {
        const int r0 = RPW * warp + QG * g;
        if (j0 + r0 >= n) break;
        float d[QG];
#pragma unroll
        for (int u = 0; u < QG; u++) {
          d[u] = 0.f;
#pragma unroll
          for (int i = 0; i < NT; i++) d[u] += qr[i] * to_f32(tile[(r0 + u) * D + lane + 32 * i]);
        }
        const float sc = warp_sums<QG>(d, lane) * a.scale;  // lane l: key r0 + (l >> (5 - LQ))
        const int j = j0 + r0 + (lane >> (5 - LQ));
        if (j < n) {
          if ((lane & ((32 >> LQ) - 1)) == 0) p[j] = sc;
          m = fmaxf(m, sc);
        }
      }
      continue;
    }
    if (f == nk) {  // every score is in p[] (the barrier above): the softmax, attention_kernel's
      m = block_max(m, scratch);
      float sum = 0.f;
      if (tid < kDecSumThreads)
        for (int j = tid; j < n; j += kDecSumThreads) {
          p[j] = expf(p[j] - m);
          sum += p[j];
        }
      sum = block_sum(sum, scratch);
      inv = 1.0f / sum;
      __syncthreads();
    }
    // V: each output dim a sequential sum over the tile's rows in order.
    const int j0 = (f - nk) * kAttnRows, rows = min(kAttnRows, n - j0);
#pragma unroll
    for (int u = 0; u < NT; u++) {
      const int i = tid + NTH * u;
      if (i >= D) break;
      float acc = o[u];
      int r = 0;
      for (; r + 8 <= rows; r += 8)
#pragma unroll
        for (int e = 0; e < 8; e++) acc += (p[j0 + r + e] * inv) * to_f32(tile[(r + e) * D + i]);
      for (; r < rows; r++) acc += (p[j0 + r] * inv) * to_f32(tile[r * D + i]);
      o[u] = acc;
    }
  }
  ptx::cp_async_wait<0>();
#pragma unroll
  for (int u = 0; u < NT; u++) {
    const int i = tid + NTH * u;
    if (i >= D) break;  // (whole warps: D is a multiple of 32)
    ctx[t * a.o_tok + int64_t(h) * a.o_head + i] = from_f32<TA>(o[u]);
    if (a.o_frag.xf) store_fragment_pair(a.o_frag, int(t), h * D + i, o[u], a.Hq * D);
  }
}

// Rope of dr dims at position pos, from in to out (may not alias across lanes: each lane reads
// and writes its own pairs), lanes of one warp; cos/sin in fp32 times the attention factor, as
// kernels/ops.cc Rope::apply.
template <class TO>
__device__ inline void rope_lanes(const float* in, TO* out, int dr, int pos, const float* inv_freq, float af,
                                  bool interleaved, int lane, int lanes) {
  const int half = dr / 2;
  for (int i = lane; i < half; i += lanes) {
    const float f = float(pos) * inv_freq[i];
    const float c = cosf(f) * af, sn = sinf(f) * af;
    const int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
    const float x0 = in[i0], x1 = in[i1];
    out[i0] = from_f32<TO>(x0 * c - x1 * sn);
    out[i1] = from_f32<TO>(x1 * c + x0 * sn);
  }
}

// One block per token: the q LoRA norm, the latent norm and the rotated k_rope into the cache
// (KT: its value type).
template <class KT>
__global__ void mla_latent_kernel(const MlaLatentArgs a) {
  __shared__ float scratch[32];
  pdl_wait();  // (launched with launch_pdl: nothing of an earlier kernel is touched before this)
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const float* row = a.a + t * a.lda;
  if (a.q_lora > 0) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < a.q_lora; i += blockDim.x) ss += row[i] * row[i];
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / float(a.q_lora) + a.eps);
    for (int i = threadIdx.x; i < a.q_lora; i += blockDim.x) a.qa_out[t * a.q_lora + i] = a.q_a_norm[i] * (row[i] * inv);
  }
  const TokenSlot slot = a.slots[t];
  const int64_t W = int64_t(a.C) + a.dr;
  KT* dst = static_cast<KT*>(a.kv.k) + kv_row(a.kv, a.kv.tables + slot.table, a.layer, slot.pos, W);
  const float* lat = row + a.q_width;
  float ss = 0.f;
  for (int i = threadIdx.x; i < a.C; i += blockDim.x) ss += lat[i] * lat[i];
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / float(a.C) + a.eps);
  for (int i = threadIdx.x; i < a.C; i += blockDim.x) dst[i] = from_f32<KT>(a.kv_a_norm[i] * (lat[i] * inv));
  if (threadIdx.x < 32)
    rope_lanes(lat + a.C, dst + a.C, a.dr, slot.pos, a.inv_freq, a.attention_factor, a.interleaved, threadIdx.x, 32);
}

// One warp per (token, head).
__global__ void mla_query_kernel(const MlaQueryArgs a) {
  pdl_wait();  // (launched with launch_pdl: nothing of an earlier kernel is touched before this)
  pdl_trigger();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t job = int64_t(blockIdx.x) * nw + warp;
  if (job >= a.T * a.Hq) return;
  const int64_t t = job / a.Hq;
  const int h = int(job % a.Hq);
  const float* qh = a.q + t * a.ldq + int64_t(h) * (a.dn + a.dr);
  float* qn = a.q_nope + (int64_t(h) * a.T + t) * a.dn;
  for (int i = lane; i < a.dn; i += 32) qn[i] = qh[i];
  float* qr = a.q_cat + (t * a.Hq + h) * (int64_t(a.C) + a.dr) + a.C;
  rope_lanes(qh + a.dn, qr, a.dr, a.slots[t].pos, a.inv_freq, a.attention_factor, a.interleaved, lane, 32);
}

__global__ void head_major_rows_kernel(int64_t T, int Hq, int32_t* out) {
  pdl_wait();  // (launched with launch_pdl: nothing of an earlier kernel is touched before this)
  pdl_trigger();
  const int64_t n = T * Hq;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i / T, t = i - h * T;
    out[i] = int32_t(t * Hq + h);
  }
}

}  // namespace

void qk_norm_rope_cache(const RopeArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  constexpr int warps = 4;
  const int64_t jobs = a.T * (a.Hq + 2 * a.Hkv);
  const dim3 grid(unsigned(ceil_div(jobs, warps))), block(warps * 32);
  const size_t smem = size_t(warps) * a.D * sizeof(float);
  if (a.kv.bf16) launch_pdl(rope_kernel<bf16>, grid, block, smem, s, a);
  else launch_pdl(rope_kernel<float>, grid, block, smem, s, a);
  EPMOE_CUDA_LAUNCHED();
}

void copy_kv_block(const KvPages& kv, int layers, int64_t k_width, int64_t v_width, int32_t src, int32_t dst,
                   cudaStream_t s) {
  if (layers == 0) return;
  if (kv.bf16) copy_kv_block_kernel<bf16><<<unsigned(2 * layers), 256, 0, s>>>(kv, k_width, v_width, src, dst);
  else copy_kv_block_kernel<float><<<unsigned(2 * layers), 256, 0, s>>>(kv, k_width, v_width, src, dst);
  EPMOE_CUDA_LAUNCHED();
}

// attention_tiled_kernel's shapes: QW heads per score warp, Gs heads and TQ tokens per block.
struct AttnTiling {
  int QW = 1, Gs = 1, TQ = 1, ncap = 1;
  size_t smem = 0;
};
static size_t tiled_smem(const AttnArgs& a, int queries, int ncap) {
  return (size_t(kAttnRows) * size_t(std::max(a.Dk, a.Dv)) + size_t(queries) * size_t(ncap)) * sizeof(float);
}
constexpr size_t kTiledSmemMax = 200 * 1024;

// The tiled kernel's shapes for a, or false where it does not apply (head dims other than 64 and
// 128, latent attention's 576 / 512, unaligned rows, too long a context: attention_kernel then).
static bool attention_tiling(const AttnArgs& a, AttnTiling* tp) {
  if ((a.Dk != 64 && a.Dk != 128) || (a.Dv != 64 && a.Dv != 128)) return false;
  if (a.k_stride % 4 || a.v_stride % 4 || reinterpret_cast<uintptr_t>(a.kv.k) % 16 ||
      reinterpret_cast<uintptr_t>(a.kv.v) % 16)
    return false;
  AttnTiling t;
  const int G = a.Hq / a.Hkv;
  t.ncap = a.max_ctx | 1;  // (an odd row stride: the score stores of one warp in distinct banks)
  while (t.QW < 8 && G % (2 * t.QW) == 0) t.QW *= 2;
  t.Gs = t.QW;
  while (2 * t.Gs <= 8 * t.QW && G % (2 * t.Gs) == 0) t.Gs *= 2;
  // Up to 8 query groups a block; more tokens only within about half an SM's shared memory (two
  // blocks resident), and only when a sequence brings that many to the step.
  while (2 * t.TQ <= a.max_run && 2 * t.TQ * t.Gs <= 8 * t.QW && tiled_smem(a, 2 * t.TQ * t.Gs, t.ncap) <= 112 * 1024)
    t.TQ *= 2;
  while (tiled_smem(a, t.Gs, t.ncap) > kTiledSmemMax && t.Gs > 1) {
    if (t.Gs == t.QW) t.QW /= 2;
    t.Gs /= 2;
  }
  t.smem = tiled_smem(a, t.TQ * t.Gs, t.ncap);
  if (t.smem > kTiledSmemMax) return false;
  *tp = t;
  return true;
}

template <class TA, class KT, int NT>
static auto tiled_instance(int QW) {
  return QW == 8 ? attention_tiled_kernel<TA, KT, NT, 8>
       : QW == 4 ? attention_tiled_kernel<TA, KT, NT, 4>
       : QW == 2 ? attention_tiled_kernel<TA, KT, NT, 2>
                 : attention_tiled_kernel<TA, KT, NT, 1>;
}

// Every instance of the tiled kernel may take kTiledSmemMax (set once, outside any capture).
static void raise_tiled_smem() {
  static bool done = false;
  if (done) return;
  for (int qw : {1, 2, 4, 8}) {
    for (auto k : {tiled_instance<float, float, 2>(qw), tiled_instance<float, float, 4>(qw),
                   tiled_instance<float, bf16, 2>(qw), tiled_instance<float, bf16, 4>(qw)})
      EPMOE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kTiledSmemMax)));
    for (auto k : {tiled_instance<bf16, float, 2>(qw), tiled_instance<bf16, float, 4>(qw),
                   tiled_instance<bf16, bf16, 2>(qw), tiled_instance<bf16, bf16, 4>(qw)})
      EPMOE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kTiledSmemMax)));
  }
  done = true;
}

// The decode kernel's block. Where its blocks are one per SM at most (T Hq <= the SMs: one to four
// sequences of Qwen3-30B-A3B), a block's latency is the kernel's: 8 warps (EPMOE_ATTN_DECODE_WARPS
// = 4, 8 or 16) share the scores, and 8 staged tiles, where they and the scores fit the shared
// memory, put a context of up to 448 positions in flight before the wait. Beyond, the blocks
// queue for the SMs: 4 warps and 4 stages, the kernel's shape before run 30, fit three to an SM
// (run 30, H100, 48 layers, 8 sequences: 8 warps and 8 stages, one 128 KB block an SM, took 17.4
// ms a step against 16.7 with 4 and 4).
struct DecodeShape {
  int warps = 4, stages = 4;
};
static int decode_warps() {
  static const int w = [] {
    const int v = env_int("EPMOE_ATTN_DECODE_WARPS", 8);
    return v == 4 || v == 16 ? v : 8;
  }();
  return w;
}
// attention_decode_kernel's shared memory: the staged tiles, then the scores of max_ctx positions.
static size_t decode_smem(const AttnArgs& a, int stages) {
  return size_t(stages) * kAttnRows * size_t(a.Dk) * a.kv.value_bytes() + size_t(a.max_ctx) * sizeof(float);
}
static DecodeShape decode_shape(const AttnArgs& a) {
  static const int most = env_int("EPMOE_ATTN_DECODE_STAGES", 8) == 4 ? 4 : 8;
  DecodeShape s;
  if (!decode_blocks_one_per_sm(a.T, a.Hq)) return s;
  s.warps = decode_warps();
  s.stages = most == 8 && decode_smem(a, 8) <= kTiledSmemMax ? 8 : 4;
  return s;
}

template <class TA, class KT, bool ROPE, int NW, int STG>
static auto decode_instance_of(int D) {
  return D == 64 ? attention_decode_kernel<TA, KT, 2, ROPE, NW, STG> : attention_decode_kernel<TA, KT, 4, ROPE, NW, STG>;
}
template <class TA, class KT, bool ROPE = false>
static auto decode_instance(int D, DecodeShape s) {
  if (s.warps == 4) return s.stages == 8 ? decode_instance_of<TA, KT, ROPE, 4, 8>(D) : decode_instance_of<TA, KT, ROPE, 4, 4>(D);
  if (s.warps == 16)
    return s.stages == 8 ? decode_instance_of<TA, KT, ROPE, 16, 8>(D) : decode_instance_of<TA, KT, ROPE, 16, 4>(D);
  return s.stages == 8 ? decode_instance_of<TA, KT, ROPE, 8, 8>(D) : decode_instance_of<TA, KT, ROPE, 8, 4>(D);
}
// Where the decode kernel applies: K and V rows of one width (64 or 128), 16-byte aligned rows
// (cp.async), the scores within the shared memory.
static bool decode_applies(const AttnArgs& a) {
  const size_t vb = a.kv.value_bytes();
  return a.Dk == a.Dv && (a.Dk == 64 || a.Dk == 128) && (a.k_stride * vb) % 16 == 0 && (a.v_stride * vb) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(a.kv.k) % 16 == 0 && reinterpret_cast<uintptr_t>(a.kv.v) % 16 == 0 &&
         decode_smem(a, 4) <= kTiledSmemMax;
}
static void raise_decode_smem() {
  static bool done = false;
  if (done) return;
  for (int d : {64, 128})
    for (const DecodeShape s : {DecodeShape{4, 4}, DecodeShape{decode_warps(), 4}, DecodeShape{decode_warps(), 8}}) {
      for (auto k : {decode_instance<float, float>(d, s), decode_instance<float, bf16>(d, s),
                     decode_instance<float, float, true>(d, s), decode_instance<float, bf16, true>(d, s)})
        EPMOE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kTiledSmemMax)));
      for (auto k : {decode_instance<bf16, float>(d, s), decode_instance<bf16, bf16>(d, s),
                     decode_instance<bf16, float, true>(d, s), decode_instance<bf16, bf16, true>(d, s)})
        EPMOE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kTiledSmemMax)));
    }
  done = true;
}

// The most tokens of a decode step (one token per sequence) that take the decode kernel: above it
// the tiled kernel's one block per kv head (K/V read once for the Hq / Hkv heads of a group) has
// blocks enough. EPMOE_ATTN_DECODE=N sets it (0: never; for measuring the kernels against each other).
static int64_t decode_max_tokens() {
  static const int64_t n = [] {
    return int64_t(env_int("EPMOE_ATTN_DECODE", 32));
  }();
  return n;
}

// The dynamic shared memory of attention_kernel: the query and the scores of max_ctx positions.
static size_t attention_smem(int Dk, int max_ctx) { return (size_t(Dk) + size_t(max_ctx)) * sizeof(float); }

void attention_prepare(int Dk, int max_ctx) {
  raise_tiled_smem();
  raise_decode_smem();
  static size_t raised = 48 * 1024;  // the limit set on both instantiations
  const size_t smem = attention_smem(Dk, max_ctx);
  if (smem <= raised) return;
  EPMOE_ASSERT(smem <= 200 * 1024, "gpu attention: context of " + std::to_string(max_ctx) +
                                       " positions exceeds this kernel's shared-memory scores");
  for (auto k : {attention_kernel<float, float>, attention_kernel<float, bf16>})
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  for (auto k : {attention_kernel<bf16, float>, attention_kernel<bf16, bf16>})
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  raised = smem;
}

bool decode_blocks_one_per_sm(int64_t T, int Hq) { return T * Hq <= sm_count(); }

template <class TA>
bool attention(const AttnArgs& a_in, TA* ctx, cudaStream_t s) {
  if (a_in.T == 0) return false;
  AttnArgs a = a_in;
  if (a.rope.qkv) {
    const RopeArgs& r = a.rope;
    EPMOE_ASSERT(r.T == a.T && r.Hq == a.Hq && r.Hkv == a.Hkv && r.D == a.Dk && a.Dk == a.Dv &&
                     a.k_stride == int64_t(a.Hkv) * a.Dk && a.v_stride == a.k_stride && r.slots == a.slots &&
                     r.layer == a.layer && r.kv.k == a.kv.k && r.kv.v == a.kv.v && r.q_out,
                 "gpu attention: the rope's shapes, slots and KV pages must be the attention's");
    a.q = r.q_out, a.q_tok = int64_t(a.Hq) * a.Dk, a.q_head = a.Dk;
  }
  EPMOE_ASSERT(a.Hkv >= 1 && a.Hq % a.Hkv == 0, "gpu attention: q heads a multiple of kv heads");
  // EPMOE_ATTN_TILED=0: attention_kernel everywhere (for measuring what the tiles are worth).
  static const bool tiled_on = [] {
    return !env_off("EPMOE_ATTN_TILED");
  }();
  AttnKernel kind = a.kernel;
  if (kind == AttnKernel::Auto)
    kind = a.max_run == 1 && a.T <= decode_max_tokens() && decode_applies(a) ? AttnKernel::Decode
         : tiled_on                                                         ? AttnKernel::Tiled
                                                                            : AttnKernel::Reference;
  // The rope first, unless the decode kernel takes it over.
  const bool own_rope = kind == AttnKernel::Decode && a.rope.qkv && !a.rope_separate;
  if (a.rope.qkv && !own_rope) qk_norm_rope_cache(a.rope, s);
  if (!own_rope) a.rope = {};
  if (kind == AttnKernel::Decode) {
    EPMOE_ASSERT(a.max_run == 1 && decode_applies(a), "gpu attention: the decode kernel does not apply to this step");
    raise_decode_smem();
    const DecodeShape shape = decode_shape(a);
    auto k = a.kv.bf16 ? (own_rope ? decode_instance<TA, bf16, true>(a.Dk, shape) : decode_instance<TA, bf16>(a.Dk, shape))
                       : (own_rope ? decode_instance<TA, float, true>(a.Dk, shape) : decode_instance<TA, float>(a.Dk, shape));
    static const bool early_on = !env_off("EPMOE_ATTN_EARLY_TILES");
    AttnArgs b = a;
    b.early_tiles = a.early_tiles || early_on;
    // The fragments only of fp32 rows [T][Hq * Dv] as split_gemv reads them (its x is fp32).
    const bool frag = a.o_frag.xf && std::is_same_v<TA, float> && a.o_head == a.Dv && a.o_tok == int64_t(a.Hq) * a.Dv &&
                      (a.Hq * a.Dv) % 64 == 0 && a.T <= a.o_frag.rows;
    if (!frag) b.o_frag = {};
    const int64_t blocks = b.T * b.Hq + (frag ? a.o_frag.rows - b.T : 0);
    launch_pdl(k, dim3(unsigned(blocks)), dim3(unsigned(32 * shape.warps)), decode_smem(b, shape.stages), s, b, ctx);
    EPMOE_CUDA_LAUNCHED();
    return frag;
  }
  AttnTiling t;
  if (kind == AttnKernel::Tiled && attention_tiling(a, &t)) {
    raise_tiled_smem();
    const int64_t blocks = int64_t(ceil_div(a.T, t.TQ)) * (a.Hq / t.Gs);
    auto k = a.kv.bf16 ? (a.Dk == 64 ? tiled_instance<TA, bf16, 2>(t.QW) : tiled_instance<TA, bf16, 4>(t.QW))
                       : (a.Dk == 64 ? tiled_instance<TA, float, 2>(t.QW) : tiled_instance<TA, float, 4>(t.QW));
    launch_pdl(k, dim3(unsigned(blocks)), dim3(kAttnThreads), t.smem, s, a, ctx, t.Gs, t.TQ, t.ncap);
    EPMOE_CUDA_LAUNCHED();
    return false;
  }
  attention_prepare(a.Dk, a.max_ctx);
  const size_t smem = attention_smem(a.Dk, a.max_ctx);
  if (a.kv.bf16) launch_pdl(attention_kernel<TA, bf16>, dim3(unsigned(a.T * a.Hq)), dim3(128), smem, s, a, ctx);
  else launch_pdl(attention_kernel<TA, float>, dim3(unsigned(a.T * a.Hq)), dim3(128), smem, s, a, ctx);
  EPMOE_CUDA_LAUNCHED();
  return false;
}
template bool attention<float>(const AttnArgs&, float*, cudaStream_t);
template bool attention<bf16>(const AttnArgs&, bf16*, cudaStream_t);

void mla_latent_cache(const MlaLatentArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  EPMOE_ASSERT(a.dr % 2 == 0, "mla: qk_rope_head_dim " + std::to_string(a.dr) + " is not even");
  if (a.kv.bf16) launch_pdl(mla_latent_kernel<bf16>, dim3(unsigned(a.T)), dim3(128), 0, s, a);
  else launch_pdl(mla_latent_kernel<float>, dim3(unsigned(a.T)), dim3(128), 0, s, a);
  EPMOE_CUDA_LAUNCHED();
}

void mla_queries(const MlaQueryArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  constexpr int warps = 4;
  launch_pdl(mla_query_kernel, dim3(unsigned(ceil_div(a.T * a.Hq, warps))), dim3(warps * 32), 0, s, a);
  EPMOE_CUDA_LAUNCHED();
}

void head_major_rows(int64_t T, int Hq, int32_t* out, cudaStream_t s) {
  if (T == 0) return;
  launch_pdl(head_major_rows_kernel, dim3(unsigned(grid_for(T * Hq))), dim3(256), 0, s, T, Hq, out);
  EPMOE_CUDA_LAUNCHED();
}

}  // namespace epmoe::cuda
