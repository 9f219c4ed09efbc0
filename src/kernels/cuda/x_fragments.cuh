// split_gemv's input (kernels/cuda/split_gemv.cu): x [T, K] split into bf16 hi/lo, in the order of
// the m16n8k16 A fragments. split_gemv's own kernel writes it from x in memory; a kernel that
// produces x (the RMSNorm before the q/k/v projection) may write it instead, as it writes x, and
// save split_gemv that launch -- the same values, so the same bits.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace epmoe::cuda {

// Where x's fragments go: xf [rows / 8 halves][nblk = K / 64][32 lanes][16 words]; rows is T
// rounded up to 8 or 16 (split_gemv's row halves). xf == nullptr: nobody asked.
struct XFragments {
  uint32_t* xf = nullptr;
  int nblk = 0;
  int rows = 0;
};

// bf16 pair (k even in the low half), as the MMA reads a word.
__device__ inline uint32_t pack_bf16(bf16 lo_k, bf16 hi_k) {
  return uint32_t(__bfloat16_as_ushort(lo_k)) | (uint32_t(__bfloat16_as_ushort(hi_k)) << 16);
}

// x's pair (v0, v1) split: hi = bf16(v), lo = bf16(v - hi) (split_rows_kernel's rounding).
__device__ inline void split_pair(float v0, float v1, uint32_t& hi, uint32_t& lo) {
  const bf16 h0 = __float2bfloat16_rn(v0), h1 = __float2bfloat16_rn(v1);
  hi = pack_bf16(h0, h1);
  lo = pack_bf16(__float2bfloat16_rn(v0 - __bfloat162float(h0)), __float2bfloat16_rn(v1 - __bfloat162float(h1)));
}

// Lane (r = lane / 4, t = lane % 4) of an m16n8k16 MMA holds, for k16 step s of a 64-wide block,
// words at k = 16 s + 2t .. +1 and 16 s + 8 + 2t .. +1; word 2 s + h of its 8.
__device__ inline int frag_k(int lane, int word) { return 16 * (word >> 1) + 8 * (word & 1) + 2 * (lane & 3); }

// x[row][k], x[row][k + 1] (k even) into the fragments: the inverse of frag_k, hi at word,
// lo at word + 8 of (half row / 8, block k / 64, lane (row % 8) * 4 + t).
__device__ inline void store_x_pair(const XFragments& o, int row, int k, float v0, float v1) {
  const int j = k >> 6, kk = k & 63;
  const int word = 2 * (kk >> 4) + ((kk >> 3) & 1), lane = (row & 7) * 4 + ((kk & 7) >> 1);
  uint32_t hi, lo;
  split_pair(v0, v1, hi, lo);
  uint32_t* dst = o.xf + ((int64_t(row >> 3) * o.nblk + j) * 32 + lane) * 16;
  dst[word] = hi;
  dst[8 + word] = lo;
}

}  // namespace epmoe::cuda
