// The layout of split_gemv's x fragments, written once: split_gemv.cu's x-split kernel writes it,
// and so do the kernels that compute a decode step's x (the input RMSNorm, decode attention; not
// with EPMOE_NORM_SPLITS=0), saving the x-split launches on the step's chain. x [T, K] fp32 is split into bf16 hi = bf16(v), lo = bf16(v - hi), and the pairs
// (k, k + 1) of row r land where lane (r % 8) * 4 + t of an m16n8k16 MMA loads its A words:
//   xf[half = r / 8][block j = k / 64][lane][16 words], word 2 s + h of xh (8 + 2 s + h of xl),
// for k = 64 j + 16 s + 8 h + 2 t. Rows past T are zero (split_gemv reads 8 or 16 rows).
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace epmoe::cuda {

// The k of word `word` (0..7) of `lane` within a 64-wide block: the inverse of x_fragment_slot.
__device__ inline int frag_k(int lane, int word) { return 16 * (word >> 1) + 8 * (word & 1) + 2 * (lane & 3); }

__device__ inline uint32_t pack_bf16(bf16 lo_k, bf16 hi_k) {
  return uint32_t(__bfloat16_as_ushort(lo_k)) | (uint32_t(__bfloat16_as_ushort(hi_k)) << 16);
}

// The hi and lo words of the pair (v0, v1) = x[r][k], x[r][k + 1] (split_rows_kernel's split).
__device__ inline void split_pair(float v0, float v1, uint32_t& hi, uint32_t& lo) {
  const bf16 h0 = __float2bfloat16_rn(v0), h1 = __float2bfloat16_rn(v1);
  hi = pack_bf16(h0, h1);
  lo = pack_bf16(__float2bfloat16_rn(v0 - __bfloat162float(h0)), __float2bfloat16_rn(v1 - __bfloat162float(h1)));
}

// Where the hi word of the pair (row r, even k) goes (the lo word is 8 words on); nblk = K / 64.
__device__ inline int64_t x_fragment_slot(int r, int k, int nblk) {
  const int j = k >> 6, kk = k & 63;
  const int word = 2 * (kk >> 4) + ((kk >> 3) & 1), lane = (r & 7) * 4 + ((kk >> 1) & 3);
  return ((int64_t(r >> 3) * nblk + j) * 32 + lane) * 16 + word;
}

// The destination a norm writes its rows to besides its fp32 / act outputs: split_gemv's x
// fragments of the next projection (split_gemv_x_fragments), `rows` (8 or 16) of them -- rows past
// the T normalised ones written as zeros.
struct XFragments {
  uint32_t* xf = nullptr;
  int rows = 0;
};

// A norm's output element i = v of row r, from a warp whose lanes hold consecutive i (every lane
// of the warp calls this: H a multiple of 32): the even lane splits the pair (i, i + 1) and
// writes both of its words.
__device__ inline void store_fragment_pair(const XFragments& xo, int r, int i, float v, int H) {
  const float v1 = __shfl_down_sync(0xffffffffu, v, 1);
  if ((i & 1) == 0) {
    uint32_t hi, lo;
    split_pair(v, v1, hi, lo);
    const int64_t at = x_fragment_slot(r, i, H / 64);
    xo.xf[at] = hi;
    xo.xf[at + 8] = lo;
  }
}

// Row r (>= T) of the fragments as zeros, by one block.
__device__ inline void zero_fragment_row(const XFragments& xo, int r, int H) {
  for (int k = 2 * int(threadIdx.x); k < H; k += 2 * int(blockDim.x)) {
    const int64_t at = x_fragment_slot(r, k, H / 64);
    xo.xf[at] = 0u;
    xo.xf[at + 8] = 0u;
  }
}

}  // namespace epmoe::cuda
