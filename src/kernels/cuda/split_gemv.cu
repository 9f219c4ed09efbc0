// split_linear for a decode step's few rows (T <= 16) of a periodic weight: the same bits as
// split_rows + the mma.sync tile kernel, in fewer instructions per weight byte.
//
// Why a kernel of its own: at 1 to 16 rows the tile kernel reads a q/k/v or o projection at
// 0.1-0.2 of HBM's rate. Nsight Compute (q/k/v, one row): each of its 320 warps issues ~8,500
// instructions (133 per 64-wide k-tile: cp.async addressing, barrier, ldmatrix, 8 MMAs) at ~4.3
// cycles each, with 2.4 warps per SM to hide nothing: the step is the length of one warp's
// instruction stream, not DRAM (21% of it). An output is a chain of K'/16 dependent MMAs (no
// split-K: batch invariance), so the cure is fewer instructions per MMA and more warps:
//   - the weights are stored a second time in fragment order (SplitWeight::pack_fragments): each
//     lane's B fragments of a 64-wide block are 32 contiguous bytes, two 16-byte loads straight
//     into registers (no shared memory, no barrier, no ldmatrix), DEPTH blocks in flight;
//   - x is split into hi/lo once per call, in the A fragments' order (split_x_fragments), so a
//     block's A fragments are four 16-byte loads from L1;
//   - one warp per 8 output columns: 640 warps for q/k/v instead of 320.
//
// v4 (issue 33, the default): the weight blocks come through a ring of RING blocks per warp in
// shared memory (cp.async), not registers. A register prefetch held at most 8 blocks (8 KB) in
// flight per warp -- the o projection's 256 warps kept ~2 MB in flight, short of what HBM's latency
// needs -- and depth 16 spilled. The ring holds 32 KB per warp without a register, and its first
// RING blocks are requested before pdl_wait, while the kernel before still runs (the weights depend
// on no kernel). Each lane copies and reads back only its own 32 bytes of a block: no barrier.
// x's fragments come from L2 XA blocks ahead in registers (one block ahead left an L2 round trip on
// the MMA chain). SplitGemvConfig::ring = 0 keeps v3 (registers, `depth` blocks) for comparison.
//
// The bits: every output is the tile kernel's b_k_twice chain -- per 64-wide weight block j, the
// four k16 MMAs with xh's columns of that block, then the four with xl's, in ascending j, from
// zero -- with the same mma.sync instruction and the same fragment values (x split as
// split_rows_kernel splits it), then store_pair. Rows past T are zero, as the tile kernel's
// zero-filled rows; they reach no output. GpuGemm.SplitGemvKeepsTheBits checks it.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda/mma_ptx.cuh"
#include "util/env.h"
#include "kernels/cuda/split_linear.cuh"
#include "kernels/cuda/x_fragments.cuh"

namespace epmoe::cuda {

namespace {

using ptx::smem_u32;
using ptx::mma_bf16;
using ptx::store_pair;

// Lane (r = lane / 4, t = lane % 4) of an m16n8k16 MMA holds, for k16 step s of a 64-wide block,
// B words b0 = w[r][16 s + 2t .. +1] and b1 = w[r][16 s + 8 + 2t .. +1]; word 2 s + h of its 8
// (frag_k, x_fragments.cuh: the A fragments' k order is the same).

// frag[g][j][q][lane][4] = the B words 4q .. 4q + 3 of lane for rows 8g.. and block j (zero past
// N): each of a warp's two 16-byte loads of a block reads 512 contiguous bytes.
__global__ void pack_fragments_kernel(const bf16* w, int N, int K, uint32_t* frag) {
  const int nblk = K / 64;
  const int64_t n = int64_t((N + 7) / 8) * nblk * 32 * 8;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int lane = int((i >> 2) & 31), word = int(i & 3) + 4 * int((i >> 7) & 1);
    const int64_t gj = i >> 8;
    const int j = int(gj % nblk), g = int(gj / nblk);
    const int row = 8 * g + (lane >> 2), k = 64 * j + frag_k(lane, word);
    frag[i] = row < N ? pack_bf16(w[int64_t(row) * K + k], w[int64_t(row) * K + k + 1]) : 0u;
  }
}

// v5's layout, W as the MMA's A operand: frag16[g][j][s][lane][4] = lane's A words of k16 step s
// of block j for W's rows 16g.. (the output columns; zero past N): word 0 row r, k 16 s + 2t;
// word 1 row r + 8, the same k; words 2 and 3 the same rows at k + 8 (r = lane / 4, t = lane % 4,
// k within the block). A warp's 16-byte load of a step reads 512 contiguous bytes.
__global__ void pack_fragments16_kernel(const bf16* w, int N, int K, uint32_t* frag) {
  const int nblk = K / 64;
  const int64_t n = int64_t((N + 15) / 16) * nblk * 4 * 32 * 4;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int word = int(i & 3), lane = int((i >> 2) & 31), s = int((i >> 7) & 3);
    const int64_t gj = i >> 9;
    const int j = int(gj % nblk), g = int(gj / nblk);
    const int row = 16 * g + (lane >> 2) + 8 * (word & 1);
    const int k = 64 * j + 16 * s + 8 * (word >> 1) + 2 * (lane & 3);
    frag[i] = row < N ? pack_bf16(w[int64_t(row) * K + k], w[int64_t(row) * K + k + 1]) : 0u;
  }
}

// x [T, K] fp32 -> xf[half][j][lane][16]: for rows r = lane / 4 (half 0) and r + 8 (half 1), the
// A words a0 / a2 (a1 / a3 for half 1) of the four k16 steps of block j, xh's then xl's:
// word 2 s + h of xh is pack(split_hi(x[r][16 s + 8 h + 2t .. +1])), word 8 + 2 s + h of xl.
// Rows past T are zero. The split is split_rows_kernel's.
__global__ void split_x_fragments_kernel(const float* x, int64_t lda, int T, int K, int halves, uint32_t* xf) {
  pdl_wait();
  pdl_trigger();
  const int nblk = K / 64;
  const int64_t n = int64_t(halves) * nblk * 32 * 8;  // one thread per (half, j, lane, word of xh)
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int word = int(i & 7), lane = int((i >> 3) & 31);
    const int64_t hj = i >> 8;
    const int j = int(hj % nblk), half = int(hj / nblk);
    const int row = (lane >> 2) + 8 * half, k = 64 * j + frag_k(lane, word);
    uint32_t hi = 0, lo = 0;
    if (row < T) split_pair(x[int64_t(row) * lda + k], x[int64_t(row) * lda + k + 1], hi, lo);
    uint32_t* dst = xf + ((int64_t(half) * nblk + j) * 32 + lane) * 16;
    dst[word] = hi;
    dst[8 + word] = lo;
  }
}

// A lane's x fragments of 64-wide k block j, as every version reads them: lane (r, t)'s words of
// row r (lo) and of row r + 8 (hi, ROWS16); zeros past T or past the last block, and a lane whose
// rows are past T loads nothing (its zeros reach only outputs of rows that are not stored), so one
// row reads 1/8 of x.
template <bool ROWS16>
struct XBlocks {
  const uint4* lo;  // block j: + 128 j (rows 0..7)
  const uint4* hi;  // rows 8..15
  int nblk;
  bool ok_lo, ok_hi;
  __device__ __forceinline__ XBlocks(const uint32_t* xf, int T, int nblk_, int lane)
      : lo(reinterpret_cast<const uint4*>(xf) + lane * 4), hi(lo + int64_t(nblk_) * 128), nblk(nblk_),
        ok_lo((lane >> 2) < T), ok_hi(ROWS16 && (lane >> 2) + 8 < T) {}
  __device__ __forceinline__ void load(int j, uint4 (&xa)[4], uint4 (&xb)[4]) const {
    const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int q = 0; q < 4; q++) {
      xa[q] = ok_lo && j < nblk ? __ldg(lo + 128 * j + q) : z;
      xb[q] = ok_hi && j < nblk ? __ldg(hi + 128 * j + q) : z;
    }
  }
};

// One 64-wide k block of a warp's 8 columns, shared by v3 and v4 (so both run one chain): the tile
// kernel's b_k_twice chain, xh's k-tile of the block then xl's, k16 steps in order (b01 / b23: the
// lane's weight fragments of the block).
__device__ __forceinline__ void mma_block(float (&acc)[4], const uint4 (&xa)[4], const uint4 (&xb)[4], uint4 b01,
                                          uint4 b23) {
  const uint32_t b[8] = {b01.x, b01.y, b01.z, b01.w, b23.x, b23.y, b23.z, b23.w};
#pragma unroll
  for (int part = 0; part < 2; part++) {
    // (row r's words, row r + 8's words)
    const uint32_t r0[8] = {xa[2 * part].x, xa[2 * part].y, xa[2 * part].z, xa[2 * part].w,
                            xa[2 * part + 1].x, xa[2 * part + 1].y, xa[2 * part + 1].z, xa[2 * part + 1].w};
    const uint32_t r8[8] = {xb[2 * part].x, xb[2 * part].y, xb[2 * part].z, xb[2 * part].w,
                            xb[2 * part + 1].x, xb[2 * part + 1].y, xb[2 * part + 1].z, xb[2 * part + 1].w};
#pragma unroll
    for (int s = 0; s < 4; s++) {
      const uint32_t a[4] = {r0[2 * s], r8[2 * s], r0[2 * s + 1], r8[2 * s + 1]};
      mma_bf16(acc, a, b[2 * s], b[2 * s + 1]);
    }
  }
}

// Every kernel's start: the next kernel may request its weights meanwhile (PDL trigger); g, the
// warp's group of COLS output columns (WARPS warps a CTA); false past N -- after the PDL wait every
// CTA must make (common.cuh), so what follows the kernel sees everything before it.
template <int COLS, int WARPS>
__device__ __forceinline__ bool warp_group(const GemmArgs& p, int& g) {
  pdl_trigger();
  g = int(blockIdx.x) * WARPS + int(threadIdx.x >> 5);
  if (COLS * g < p.N) return true;
  pdl_wait();
  return false;
}

// One warp per 8 output columns (group g), WARPS warps per CTA; p.B = the packed fragments.
template <bool SWIGLU, bool ROWS16, int DEPTH, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) split_gemv_kernel(const GemmArgs p, const uint32_t* xf, int T) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int g;
  if (!warp_group<8, WARPS>(p, g)) return;
  const int nblk = p.K / 64;
  const uint4* wp = static_cast<const uint4*>(p.B) + int64_t(g) * nblk * 64 + lane;  // block j: + 64 j, + 32
  // The weights depend on no earlier kernel: the first DEPTH blocks are requested before the wait.
  uint4 bq[DEPTH][2];
#pragma unroll
  for (int d = 0; d < DEPTH; d++)
    if (d < nblk) {
      bq[d][0] = __ldcs(wp + 64 * d);
      bq[d][1] = __ldcs(wp + 64 * d + 32);
    }
  pdl_wait();
  const int r = lane >> 2;
  const XBlocks<ROWS16> x(xf, T, nblk, lane);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  // x's fragments one block ahead (an L1/L2 hit is not free: it would sit on the MMA chain).
  uint4 xa_next[4], xb_next[4];
  x.load(0, xa_next, xb_next);
  for (int j0 = 0; j0 < nblk; j0 += DEPTH) {
#pragma unroll
    for (int d = 0; d < DEPTH; d++) {
      const int j = j0 + d;
      if (j >= nblk) break;
      const uint4 b01 = bq[d][0], b23 = bq[d][1];
      if (j + DEPTH < nblk) {  // the register pair is free again: the block DEPTH ahead
        bq[d][0] = __ldcs(wp + 64 * (j + DEPTH));
        bq[d][1] = __ldcs(wp + 64 * (j + DEPTH) + 32);
      }
      uint4 xa[4], xb[4];
#pragma unroll
      for (int q = 0; q < 4; q++) xa[q] = xa_next[q], xb[q] = xb_next[q];
      x.load(j + 1, xa_next, xb_next);
      mma_block(acc, xa, xb, b01, b23);
    }
  }
  const int col = 8 * g + 2 * (lane & 3);
  if (x.ok_lo) store_pair<float, SWIGLU>(p, r, col, acc[0], acc[1]);
  if (x.ok_hi) store_pair<float, SWIGLU>(p, r + 8, col, acc[2], acc[3]);
}


// The ring's copies and waits with a compiler memory barrier each: the ring is read by plain loads
// with no __syncthreads between (each lane reads what it copied), so nothing may move a read of a
// slot above the wait for it, or below the copy that refills it.
__device__ inline void ring_copy(uint4* smem, const uint4* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem) : "memory");
}
__device__ inline void ring_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ inline void ring_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// v4: the weight blocks through a shared-memory ring of RING blocks per warp (cp.async), x's
// fragments XA blocks ahead in registers; the same MMA chain as v3, so the same bits.
template <bool SWIGLU, bool ROWS16, int RING, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) split_gemv_ring_kernel(const GemmArgs p, const uint32_t* xf, int T) {
  extern __shared__ uint4 ring_smem[];
  constexpr int XA = ROWS16 ? 2 : 4;  // (x ring registers: 16 per block ahead and row half)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int g;
  if (!warp_group<8, WARPS>(p, g)) return;
  const int nblk = p.K / 64;
  const uint4* wp = static_cast<const uint4*>(p.B) + int64_t(g) * nblk * 64 + lane;  // block j: + 64 j, + 32
  uint4* ring = ring_smem + int64_t(warp) * RING * 64 + lane;                         // slot s: + 64 s, + 32
  // The weights depend on no earlier kernel: the ring is filled before the wait. One commit group
  // per block (empty past the last), so that waiting for all but RING - 1 groups means block j.
#pragma unroll 1
  for (int b = 0; b < RING; b++) {
    if (b < nblk) {
      ring_copy(ring + 64 * b, wp + 64 * b);
      ring_copy(ring + 64 * b + 32, wp + 64 * b + 32);
    }
    ring_commit();
  }
  pdl_wait();
  const int r = lane >> 2;
  const XBlocks<ROWS16> x(xf, T, nblk, lane);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  uint4 xr[XA][4], xr8[XA][4];
#pragma unroll
  for (int a = 0; a < XA; a++) x.load(a, xr[a], xr8[a]);
  for (int j0 = 0; j0 < nblk; j0 += XA) {
#pragma unroll
    for (int d = 0; d < XA; d++) {
      const int j = j0 + d;
      if (j >= nblk) break;
      const int slot = j % RING;
      ring_wait<RING - 1>();
      const uint4 b01 = ring[64 * slot], b23 = ring[64 * slot + 32];
      uint4 xa[4], xb[4];
#pragma unroll
      for (int q = 0; q < 4; q++) xa[q] = xr[d][q], xb[q] = xr8[d][q];
      x.load(j + XA, xr[d], xr8[d]);
      mma_block(acc, xa, xb, b01, b23);
      // The slot again, for block j + RING: after the MMAs, which needed its values read (a lane
      // overwrites only what it read itself).
      if (j + RING < nblk) {
        ring_copy(ring + 64 * slot, wp + 64 * (j + RING));
        ring_copy(ring + 64 * slot + 32, wp + 64 * (j + RING) + 32);
      }
      ring_commit();
    }
  }
  ring_wait<0>();  // (nothing of this warp's left in flight at exit)
  const int col = 8 * g + 2 * (lane & 3);
  if (x.ok_lo) store_pair<float, SWIGLU>(p, r, col, acc[0], acc[1]);
  if (x.ok_hi) store_pair<float, SWIGLU>(p, r + 8, col, acc[2], acc[3]);
}

// v5's MMAs of one 64-wide block: xh's four k16 steps, then xl's, each with lane's A words
// wa[s] of the step (16 columns) and, as B, the words 2 s, 2 s + 1 of the half's 16 (uint4 q = 2 part
// + s / 2); a second chain for rows 8..15 (ROWS16) shares the A words.
template <bool ROWS16>
__device__ __forceinline__ void wide_mma_block(float (&acc)[4], float (&acc8)[4], const uint4 (&wa)[4],
                                               const uint4 (&xa)[4], const uint4 (&xb)[4]) {
#pragma unroll
  for (int part = 0; part < 2; part++)
#pragma unroll
    for (int s = 0; s < 4; s++) {
      const uint32_t a[4] = {wa[s].x, wa[s].y, wa[s].z, wa[s].w};
      const uint4 q = xa[2 * part + (s >> 1)];
      mma_bf16(acc, a, (s & 1) ? q.z : q.x, (s & 1) ? q.w : q.y);
      if constexpr (ROWS16) {
        const uint4 q8 = xb[2 * part + (s >> 1)];
        mma_bf16(acc8, a, (s & 1) ? q8.z : q8.x, (s & 1) ? q8.w : q8.y);
      }
    }
}

// v5's stores. c[2h], c[2h + 1]: column 16 g + 8 h + r of rows row0 + 2t, + 1 (r = lane / 4,
// t = lane % 4). The even lane of a pair of columns stores row 2t (its value and its odd
// neighbour's, by one shuffle with lane ^ 4), the odd lane row 2t + 1: store_pair's adjacent
// columns of one row (SwiGLU's (gate, up) pairs).
template <bool SWIGLU>
__device__ __forceinline__ void wide_store(const GemmArgs& p, const float (&c)[4], int g, int row0, int T, int lane) {
  const int r = lane >> 2, t = lane & 3;
  const bool odd = r & 1;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const float other = __shfl_xor_sync(0xffffffffu, odd ? c[2 * h] : c[2 * h + 1], 4);
    const int col = 16 * g + 8 * h + (r & ~1), row = row0 + 2 * t + (odd ? 1 : 0);
    if (row < T) {
      if (odd) store_pair<float, SWIGLU>(p, row, col, other, c[2 * h + 1]);
      else store_pair<float, SWIGLU>(p, row, col, c[2 * h], other);
    }
  }
}

// v5 (the default since run 24): the same products with the roles swapped -- W's rows are the
// MMA's A operand (m16: 16 output columns per warp), x's rows its B operand (n8: 8 rows of x per
// MMA). Why: with x as A (v4), a lane's A registers {row r, row r + 8} x {k, k + 8} are assembled
// from x's loads by moves, half of them zeros at T <= 8, and 15 of the 16 A rows are zeros at one
// sequence. As B, x's words are the aligned pairs its fragments already hold (the x_fragments.cuh
// layout is the B layout of x^T), W's A words are one 16-byte shared load per k16 step (frag16),
// each MMA does 16 columns' work, and a lane whose rows of x are past T loads no x at all.
//
// The other half of the gain (Nsight Compute, run 24): x's fragments for block j + XA are loaded
// into the registers block j's MMAs read, *after* those MMAs. Loaded before them (v4's order), the
// compiler loads into other registers and moves them at the loop's end, and each move waits for
// its load: ~40% of the first v5's stall samples sat on those moves, and its 129 instructions per
// block (47 of them moves) took 6.3 cycles each. (v4 keeps its order: with its loads moved the same
// way, its o projection took 32.1 us on the H200 of that call, v5's 19.2.) A bulk-copy variant of
// the ring (one 2 KB copy per block by lane 0, an mbarrier per slot) was measured in the same call
// and dropped: 20.8 us.
//
// The bits: output (row i of x, column c) is still, per 64-wide block in ascending order, the four
// k16 MMAs with xh then the four with xl, accumulated from zero -- D^T = B^T A^T computes each
// element from the same 16 products and the same accumulator, so transposing the MMA's operands
// leaves every element's bits (GpuGemm.SplitGemvKeepsTheBits checks it against the tile kernel;
// gpu-same-bits.sh v5 against v4: 24/24).
template <bool SWIGLU, bool ROWS16, int RING, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) split_gemv_wide_kernel(const GemmArgs p, const uint32_t* xf, int T) {
  extern __shared__ uint4 ring_smem[];
  constexpr int XA = ROWS16 ? 2 : 4;  // blocks of x's fragments ahead in registers
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int g;
  if (!warp_group<16, WARPS>(p, g)) return;
  const int nblk = p.K / 64;
  const uint4* wp = static_cast<const uint4*>(p.B) + int64_t(g) * nblk * 128 + lane;  // block j: + 128 j, step s: + 32 s
  uint4* ring = ring_smem + int64_t(warp) * RING * 128 + lane;                         // slot: + 128 slot
  // The weights depend on no earlier kernel: the ring is filled before the wait; one commit group
  // per block (empty past the last), so waiting for all but RING - 1 groups means block j is in.
#pragma unroll 1
  for (int b = 0; b < RING; b++) {
    if (b < nblk)
#pragma unroll
      for (int s = 0; s < 4; s++) ring_copy(ring + 128 * b + 32 * s, wp + 128 * b + 32 * s);
    ring_commit();
  }
  pdl_wait();
  const XBlocks<ROWS16> x(xf, T, nblk, lane);  // (here the MMA's B operand: x^T)
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, acc8[4] = {0.f, 0.f, 0.f, 0.f};
  uint4 xr[XA][4], xr8[XA][4];
#pragma unroll
  for (int a = 0; a < XA; a++) x.load(a, xr[a], xr8[a]);
  for (int j0 = 0; j0 < nblk; j0 += XA) {
#pragma unroll
    for (int d = 0; d < XA; d++) {
      const int j = j0 + d;
      if (j >= nblk) break;
      const int slot = j % RING;
      ring_wait<RING - 1>();
      uint4 wa[4];
#pragma unroll
      for (int s = 0; s < 4; s++) wa[s] = ring[128 * slot + 32 * s];
      wide_mma_block<ROWS16>(acc, acc8, wa, xr[d], xr8[d]);
      // x of block j + XA into the registers the MMAs just read, after them: loaded into others
      // and moved, the move would wait for the load (run 24's first v5 spent ~40% of its stalls so).
      x.load(j + XA, xr[d], xr8[d]);
      // The slot again, for block j + RING (a lane overwrites only what it read itself).
      if (j + RING < nblk)
#pragma unroll
        for (int s = 0; s < 4; s++) ring_copy(ring + 128 * slot + 32 * s, wp + 128 * (j + RING) + 32 * s);
      ring_commit();
    }
  }
  ring_wait<0>();  // (nothing of this warp's left in flight at exit)
  wide_store<SWIGLU>(p, acc, g, 0, T, lane);
  if constexpr (ROWS16) wide_store<SWIGLU>(p, acc8, g, 8, T, lane);
}

// v6 (issue 33, run 29): v5's products and layout, its ring filled by bulk copies. Why: at one row
// v5 is bound by one warp's instruction stream, not by its MMA chain -- Nsight Compute (run 24):
// ~101 instructions per 64-wide block at ~4.4 cycles each (a lone warp per SM hides no latency),
// ~444 cycles against the block's 8 dependent MMAs at ~26.5. Of those instructions the ring's own
// are the largest share: every lane's four 16-byte cp.async a block, their addresses, descriptors
// (17 R2UR) and commit groups. Here lane 0 asks for CH blocks at once (a group's blocks are
// contiguous in frag16: one cp.async.bulk of CH x 2 KB), completing on the slot's mbarrier, and the
// warp waits on that barrier once per CH blocks: a block is then its 4 shared loads, its 8 MMAs
// and x's loads. (Run 24's bulk variant copied a block at a time and waited per block, and was
// measured while the loop's moves of x -- fixed after it -- dominated both versions.)
//
// The ring: RING / CH slots of CH blocks per warp, one mbarrier each (count 1: lane 0's
// arrive.expect_tx; the copy's bytes complete it); slot c % SLOTS holds chunk c, the barrier's
// phase (c / SLOTS) & 1. A slot is asked for again after the warp read it: __syncwarp orders every
// lane's shared loads before lane 0's fence.proxy.async, which orders them before the bulk copy's
// writes (the async proxy). The bits are v5's: the same wide_mma_block, blocks in ascending order.
template <bool SWIGLU, bool ROWS16, int RING, int CH, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) split_gemv_bulk_kernel(const GemmArgs p, const uint32_t* xf, int T,
                                                                     int early) {
  extern __shared__ uint4 ring_smem[];
  constexpr int XA = ROWS16 ? 2 : 4;  // blocks of x's fragments ahead in registers
  constexpr int SLOTS = RING / CH;
  static_assert(RING % CH == 0 && CH % XA == 0, "split_gemv v6: whole chunks in the ring, x's registers by chunk");
  __shared__ __align__(8) uint64_t full[WARPS][SLOTS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int g;
  if (!warp_group<16, WARPS>(p, g)) return;
  const int nblk = p.K / 64, nch = (nblk + CH - 1) / CH;
  const char* wg = static_cast<const char*>(p.B) + int64_t(g) * nblk * 2048;  // the group's blocks, 2 KB each
  const uint4* ring = ring_smem + int64_t(warp) * RING * 128 + lane;            // slot: + 128 CH slot
  const uint32_t ring_addr = smem_u32(ring_smem + int64_t(warp) * RING * 128), bar0 = smem_u32(&full[warp][0]);
  auto ask = [&](int c) {  // (lane 0) chunk c into its slot
    const int slot = c % SLOTS, nb = min(CH, nblk - c * CH);
    const uint32_t bar = bar0 + 8 * slot, bytes = uint32_t(nb * 2048);
    ptx::mbar_arrive_tx(bar, bytes);
    ptx::bulk_copy_g2s(ring_addr + uint32_t(slot * CH * 2048), wg + int64_t(c) * CH * 2048, bytes, bar);
  };
  // The weights depend on no earlier kernel: the ring is asked for before the wait (its first
  // `early` chunks; the rest right after it).
  if (lane == 0) {
    for (int s = 0; s < SLOTS; s++) ptx::mbar_init(bar0 + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    for (int c = 0; c < SLOTS && c < nch && c < early; c++) ask(c);
  }
  __syncwarp();
  pdl_wait();
  if (lane == 0)
    for (int c = early; c < SLOTS && c < nch; c++) ask(c);
  const XBlocks<ROWS16> x(xf, T, nblk, lane);  // (the MMA's B operand: x^T)
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, acc8[4] = {0.f, 0.f, 0.f, 0.f};
  uint4 xr[XA][4], xr8[XA][4];
#pragma unroll
  for (int a = 0; a < XA; a++) x.load(a, xr[a], xr8[a]);
  for (int c = 0; c < nch; c++) {
    const int slot = c % SLOTS;
    ptx::mbar_wait(bar0 + 8 * slot, uint32_t(c / SLOTS) & 1u);
    const uint4* rs = ring + 128 * CH * slot;
#pragma unroll
    for (int d = 0; d < CH; d++) {
      const int j = c * CH + d;
      if (j >= nblk) break;
      uint4 wa[4];
#pragma unroll
      for (int s = 0; s < 4; s++) wa[s] = rs[128 * d + 32 * s];
      wide_mma_block<ROWS16>(acc, acc8, wa, xr[d % XA], xr8[d % XA]);
      x.load(j + XA, xr[d % XA], xr8[d % XA]);  // (into the registers just read: v5's order)
    }
    if (c + SLOTS < nch) {
      __syncwarp();
      if (lane == 0) {
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        ask(c + SLOTS);
      }
    }
  }
  wide_store<SWIGLU>(p, acc, g, 0, T, lane);
  if constexpr (ROWS16) wide_store<SWIGLU>(p, acc8, g, 8, T, lane);
}

// (set_split_gemv_config: benchmarks and tests; EPMOE_SPLIT_GEMV=v3 / v4 / v5: the earlier versions)
SplitGemvConfig g_config = [] {
  SplitGemvConfig c;
  const char* v = env_get("EPMOE_SPLIT_GEMV");
  if (v && std::string(v) == "v3") c.version = 3;
  if (v && std::string(v) == "v4") c.version = 4;
  if (v && std::string(v) == "v5") c.version = 5;
  return c;
}();

template <bool SWIGLU, bool ROWS16, int DEPTH, int WARPS>
void launch_depth_warps(const GemmArgs& g, const uint32_t* xf, int T, cudaStream_t s) {
  const dim3 grid(unsigned(ceil_div(g.N, 8 * WARPS)));
  launch_pdl(split_gemv_kernel<SWIGLU, ROWS16, DEPTH, WARPS>, grid, dim3(WARPS * 32), 0, s, g, xf, T);
  EPMOE_CUDA_LAUNCHED();
}

template <bool SWIGLU, bool ROWS16, int DEPTH>
void launch_depth(const GemmArgs& g, const uint32_t* xf, int T, cudaStream_t s) {
  switch (g_config.warps) {
    case 1: return launch_depth_warps<SWIGLU, ROWS16, DEPTH, 1>(g, xf, T, s);
    case 2: return launch_depth_warps<SWIGLU, ROWS16, DEPTH, 2>(g, xf, T, s);
    default: return launch_depth_warps<SWIGLU, ROWS16, DEPTH, 4>(g, xf, T, s);
  }
}

template <bool SWIGLU, bool ROWS16>
void launch_rows(const GemmArgs& g, const uint32_t* xf, int T, cudaStream_t s) {
  switch (g_config.depth) {
    case 4: return launch_depth<SWIGLU, ROWS16, 4>(g, xf, T, s);
    case 16: return launch_depth<SWIGLU, ROWS16, 16>(g, xf, T, s);
    default: return launch_depth<SWIGLU, ROWS16, 8>(g, xf, T, s);
  }
}

// v4 (x as the A operand: 8 columns and 1 KB of a ring block per warp), v5 and v6 (WIDE, W as the A
// operand: 16 columns, 2 KB; v6 in chunks of 4 or 8 blocks) launch alike: a ring of RING blocks for
// each of WARPS warps in dynamic shared memory.
template <bool WIDE, bool SWIGLU, bool ROWS16, int RING, int WARPS>
void launch_ring_warps(const GemmArgs& g, const uint32_t* xf, int T, cudaStream_t s) {
  constexpr int kCols = WIDE ? 16 : 8;  // output columns per warp
  using Kernel = void (*)(GemmArgs, const uint32_t*, int);
  using BulkKernel = void (*)(GemmArgs, const uint32_t*, int, int);
  // The kernels of this shape: v4, or v5, and v6 with either chunk.
  Kernel kernel = nullptr;
  BulkKernel bulk[2] = {nullptr, nullptr};
  if constexpr (WIDE) {
    kernel = split_gemv_wide_kernel<SWIGLU, ROWS16, RING, WARPS>;
    bulk[0] = split_gemv_bulk_kernel<SWIGLU, ROWS16, RING, 4, WARPS>;
    bulk[1] = split_gemv_bulk_kernel<SWIGLU, ROWS16, RING, 8, WARPS>;
  } else {
    kernel = split_gemv_ring_kernel<SWIGLU, ROWS16, RING, WARPS>;
  }
  constexpr size_t smem = size_t(WARPS) * RING * kCols * 128;
  // (Raised once for each, at the first call: an eager step, before any graph captures them.)
  static const bool raised = [&] {
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    for (BulkKernel k : bulk)
      if (k) EPMOE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return true;
  }();
  (void)raised;
  const dim3 grid(unsigned(ceil_div(g.N, kCols * WARPS)));
  if (WIDE && g_config.version >= 6) {
    const int early = g_config.early < 0 ? RING : g_config.early;  // (chunks: at most RING / 4)
    launch_pdl(bulk[g_config.chunk == 8 ? 1 : 0], grid, dim3(WARPS * 32), smem, s, g, xf, T, early);
  } else {
    launch_pdl(kernel, grid, dim3(WARPS * 32), smem, s, g, xf, T);
  }
  EPMOE_CUDA_LAUNCHED();
}

template <bool WIDE, bool SWIGLU, bool ROWS16, int RING>
void launch_ring(const GemmArgs& g, const uint32_t* xf, int T, cudaStream_t s, int warps) {
  switch (warps) {
    case 1: return launch_ring_warps<WIDE, SWIGLU, ROWS16, RING, 1>(g, xf, T, s);
    case 2: return launch_ring_warps<WIDE, SWIGLU, ROWS16, RING, 2>(g, xf, T, s);
    default: return launch_ring_warps<WIDE, SWIGLU, ROWS16, RING, 4>(g, xf, T, s);
  }
}

// The shape for a weight, one warp per CTA unless set_split_gemv_config chose the ring and warps.
// v4: a ring of 32 blocks (16 for K < 2048): 32 KB per CTA lets six CTAs share an SM, so every warp
// of the q/k/v (640) and o (256) projections is resident at once with its ring in flight. v5: 8
// blocks (16 KB: 16 columns x 512 k), 16 for K >= 4096 (run 24, H200, gpu_gemm_bench at 1 and 8
// rows: q/k/v 11.9 / 12.9 us with 8 against 12.5 / 13.5 with 16; o 19.2 / 20.0 with either, 19.7 /
// 20.5 with 32). v6: 8 blocks in two chunks of 4 (run 29, H100, one row: q/k/v 12.3 us with 8 or
// with the auto choice of v5, 12.8 with 16, 15.1 with 32; o 15.9 with 8, 16.1 with 16, 17.2 with 32;
// chunks of 8 slower at every ring). v6 with K >= 4096 (the o projection) and two rows or more: 16
// (run 36, H100, 48 layers in the graph: 8 sequences 11.16 / 11.20 ms against 11.39 / 11.38 with 8;
// one sequence level or 0.03 ms slower with 16, so one row keeps 8; the ring does not enter the bits).
int ring_for(bool wide, int K, int T) {
  if (g_config.ring > 0) return g_config.ring;
  if (g_config.version >= 6) {
    if (K < 4096) return 8;
    return g_config.ring_wide > 0 ? g_config.ring_wide : T >= 2 ? 16 : 8;
  }
  if (wide) return K >= 4096 ? 16 : 8;
  return K >= 2048 ? 32 : 16;
}

template <bool WIDE, bool SWIGLU, bool ROWS16>
void launch_shape(const GemmArgs& g, const uint32_t* xf, int T, cudaStream_t s) {
  const int ring = ring_for(WIDE, g.K, T);
  const int warps = g_config.ring > 0 ? g_config.warps : 1;
  switch (ring) {
    case 8: return launch_ring<WIDE, SWIGLU, ROWS16, 8>(g, xf, T, s, warps);
    case 16: return launch_ring<WIDE, SWIGLU, ROWS16, 16>(g, xf, T, s, warps);
    default: return launch_ring<WIDE, SWIGLU, ROWS16, 32>(g, xf, T, s, warps);
  }
}

// v4 or v5 (wide) through the ring.
template <bool SWIGLU, bool ROWS16>
void launch_rows_ring(const GemmArgs& g, const uint32_t* xf, int T, cudaStream_t s, bool wide) {
  if (wide) return launch_shape<true, SWIGLU, ROWS16>(g, xf, T, s);
  launch_shape<false, SWIGLU, ROWS16>(g, xf, T, s);
}

bool enabled_by_env() {
  static const bool on = [] {
    return !env_off("EPMOE_SPLIT_GEMV");
  }();
  return on;
}

int blocks_for(int64_t n) { return int(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, int64_t(sm_count()) * 8))); }

}  // namespace

void SplitWeight::pack_fragments(cudaStream_t s, bool every_layout) {
  EPMOE_ASSERT(periodic && K % 64 == 0, "pack_fragments: needs a periodic split weight (bf16 values, K % 64 == 0)");
  xfrag.reserve(size_t(2) * size_t(K / 64) * 32 * 16);
  if (every_layout || g_config.version < 5) {
    const int64_t n = int64_t((N + 7) / 8) * (K / 64) * 32 * 8;
    frag.reserve(size_t(n));
    pack_fragments_kernel<<<blocks_for(n), 256, 0, s>>>(w.data(), N, K, frag.data());
    EPMOE_CUDA_LAUNCHED();
  }
  if (every_layout || g_config.version >= 5) {
    const int64_t n = int64_t((N + 15) / 16) * (K / 64) * 4 * 32 * 4;
    frag16.reserve(size_t(n));
    pack_fragments16_kernel<<<blocks_for(n), 256, 0, s>>>(w.data(), N, K, frag16.data());
    EPMOE_CUDA_LAUNCHED();
  }
}

void set_split_gemv_config(SplitGemvConfig c) {
  // (v5: 2 KB a ring block per warp, so warps x ring <= 64 keeps a CTA within 227 KB.)
  EPMOE_ASSERT((c.version >= 3 && c.version <= 6) && (c.depth == 4 || c.depth == 8 || c.depth == 16) &&
                   (c.warps == 1 || c.warps == 2 || c.warps == 4) &&
                   (c.ring == -1 || c.ring == 0 || c.ring == 8 || c.ring == 16 || c.ring == 32) &&
                   (c.version == 3 || c.ring != 0) && (c.version < 5 || c.warps * c.ring <= 64) &&
                   (c.chunk == 4 || c.chunk == 8) &&
                   (c.ring_wide == -1 || c.ring_wide == 8 || c.ring_wide == 16 || c.ring_wide == 32) && c.early >= -1,
               "split_gemv: version 3/4/5/6, depth 4/8/16, warps 1/2/4, ring -1/0/8/16/32 (not 0 past v3; warps x "
               "ring <= 64 for v5 and v6), chunk 4/8, ring_wide -1/8/16/32, early >= -1, got v" +
                   std::to_string(c.version) + " depth " + std::to_string(c.depth) + " warps " +
                   std::to_string(c.warps) + " ring " + std::to_string(c.ring) + " chunk " + std::to_string(c.chunk) +
                   " ring_wide " + std::to_string(c.ring_wide) + " early " + std::to_string(c.early));
  g_config = c;
}

SplitGemvConfig split_gemv_config() { return g_config; }

bool split_gemv_enabled() { return enabled_by_env(); }

bool split_gemv_fits(const SplitWeight& W, int64_t T) {
  const bool packed = g_config.version >= 5 ? W.frag16.data() != nullptr : W.frag.data() != nullptr;
  return g_config.enabled && enabled_by_env() && W.periodic && packed && T >= 1 && T <= kSplitGemvMaxRows;
}

XFragments split_gemv_x_fragments(const SplitWeight& W, int64_t T) {
  if (!split_gemv_fits(W, T)) return {};
  return XFragments{W.xfrag.data(), T > 8 ? 16 : 8};
}

void split_gemv(const SplitWeight& W, const float* x, int64_t lda, int64_t T, float* y, const float* bias,
                Epilogue ep, cudaStream_t s, bool accumulate, bool x_split_given) {
  EPMOE_ASSERT(W.periodic && (g_config.version >= 5 ? W.frag16.data() : W.frag.data()),
               "split_gemv: needs a periodic split weight with its fragments packed for v" +
                   std::to_string(g_config.version) + " (pack_fragments under the same configuration)");
  EPMOE_ASSERT(T >= 1 && T <= kSplitGemvMaxRows, "split_gemv: " + std::to_string(T) + " rows (1.." +
                                                     std::to_string(kSplitGemvMaxRows) + ")");
  EPMOE_ASSERT(!accumulate || ep == Epilogue::Store, "split_gemv: accumulate needs the Store epilogue");
  EPMOE_ASSERT(ep != Epilogue::SwiGLU || (W.N % 2 == 0 && !bias), "split_gemv: SwiGLU needs an even N and no bias");
  const bool rows16 = T > 8;
  const int halves = rows16 ? 2 : 1, nblk = W.K / 64;
  // (xfrag is W's own: calls on the one stream run in order, so no two use it at once.)
  if (!x_split_given) {
    launch_pdl(split_x_fragments_kernel, dim3(unsigned(blocks_for(int64_t(halves) * nblk * 256))), dim3(256), 0, s,
               x, lda, int(T), W.K, halves, W.xfrag.data());
    EPMOE_CUDA_LAUNCHED();
  }
  GemmArgs g;
  g.B = g_config.version >= 5 ? static_cast<const void*>(W.frag16.data()) : static_cast<const void*>(W.frag.data());
  g.N = W.N;
  g.K = W.K;
  g.M = int(T);
  g.C = y;
  g.ldc = ep == Epilogue::SwiGLU ? W.N / 2 : W.N;
  g.bias = bias;
  g.accumulate = accumulate;
  const uint32_t* xf = W.xfrag.data();
  const bool swiglu = ep == Epilogue::SwiGLU;
  if (g_config.version >= 4) {
    const bool wide = g_config.version >= 5;
    if (swiglu && rows16) launch_rows_ring<true, true>(g, xf, int(T), s, wide);
    else if (swiglu) launch_rows_ring<true, false>(g, xf, int(T), s, wide);
    else if (rows16) launch_rows_ring<false, true>(g, xf, int(T), s, wide);
    else launch_rows_ring<false, false>(g, xf, int(T), s, wide);
    return;
  }
  if (swiglu && rows16) launch_rows<true, true>(g, xf, int(T), s);
  else if (swiglu) launch_rows<true, false>(g, xf, int(T), s);
  else if (rows16) launch_rows<false, true>(g, xf, int(T), s);
  else launch_rows<false, false>(g, xf, int(T), s);
}

}  // namespace epmoe::cuda
