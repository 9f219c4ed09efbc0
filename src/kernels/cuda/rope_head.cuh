// One (token, head) of the q/k norm + RoPE + KV-cache write (qk_norm_rope_cache), as device code
// that three kernels share: rope_kernel (a warp per job), the decode attention kernel (its own
// token's heads, AttnArgs::rope) and split_gemv's q/k/v projection (the heads it just computed,
// split_gemv_ropes). One body, so q, k and the cache rows have the same bits whichever runs it.
#pragma once

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"

namespace epmoe::cuda {

// Offset of position j's row (layer `layer`) in the K or V pool, through the sequence's block table.
__device__ __forceinline__ int64_t kv_row(const KvPages& kv, const int32_t* table, int layer, int j, int64_t kvd) {
  const int B = kv.block_tokens;
  return ((int64_t(layer) * kv.blocks + table[j / B]) * B + j % B) * kvd;
}

// One head of a token by one warp: src's D values staged in s (the warp's D floats of shared
// memory), RMS-normalised by w when given, then rotated (the first rotary_dim dims, halves) at
// position pos; put(i, value) for every dim. The roundings are written out (__fmaf_rn,
// __fmul_rn): inlined into another kernel, the compiler's choice of contraction would otherwise
// decide the bits. These are the forms it chose in rope_kernel (run 28 measured 8/8 fixtures'
// logits equal with the rotation so written; the other forms gave 0/8).
template <class Put>
__device__ __forceinline__ void norm_rope_head(const RopeArgs& a, const float* src, float* s, const float* w, int pos,
                                               int lane, Put put) {
  const int D = a.D;
  for (int i = lane; i < D; i += 32) s[i] = src[i];
  __syncwarp();
  if (w) {
    float ss = 0.f;
    for (int i = lane; i < D; i += 32) ss = __fmaf_rn(s[i], s[i], ss);
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
    put(i, __fmaf_rn(x0, cs, -__fmul_rn(x1, sn)));
    put(i + half, __fmaf_rn(x0, sn, __fmul_rn(x1, cs)));
  }
  for (int i = a.rotary_dim + lane; i < D; i += 32) put(i, s[i]);
}

// Head h (q heads, then k, then v) of token t, by one warp: src its D projected values (a.qkv's,
// or a copy), s the warp's D floats of shared memory. q to a.q_out in fp32; k into the cache
// (rounded once there when it holds bf16); v straight into the cache. KT: the cache's value type.
template <class KT>
__device__ __forceinline__ void rope_job(const RopeArgs& a, int64_t t, int h, const float* src, float* s, int lane) {
  const int D = a.D;
  const TokenSlot slot = a.slots[t];
  const int64_t kvd = int64_t(a.Hkv) * D;
  const int64_t row = h >= a.Hq ? kv_row(a.kv, a.kv.tables + slot.table, a.layer, slot.pos, kvd) : 0;
  if (h >= a.Hq + a.Hkv) {
    KT* dst = static_cast<KT*>(a.kv.v) + row + int64_t(h - a.Hq - a.Hkv) * D;
    for (int i = lane; i < D; i += 32) dst[i] = from_f32<KT>(src[i]);
    return;
  }
  if (h < a.Hq) {
    float* qdst = a.q_out + t * int64_t(a.Hq) * D + int64_t(h) * D;
    norm_rope_head(a, src, s, a.q_norm, slot.pos, lane, [&](int i, float v) { qdst[i] = v; });
  } else {
    KT* kdst = static_cast<KT*>(a.kv.k) + row + int64_t(h - a.Hq) * D;
    norm_rope_head(a, src, s, a.k_norm, slot.pos, lane, [&](int i, float v) { kdst[i] = from_f32<KT>(v); });
  }
}

}  // namespace epmoe::cuda
