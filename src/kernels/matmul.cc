#include "kernels/matmul.h"
#include "util/env.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/matmul_micro.h"
#include "kernels/ops.h"
#include "util/error.h"
#include "util/threads.h"

namespace epmoe {

namespace {

// EPMOE_KERNELS=generic|avx2|avx512 caps the path for the whole process (benchmarks comparing
// paths in one binary; a bit-equality check between machines). Unset or "auto": the best the CPU
// has. A path the CPU lacks falls back to the next one down, as Auto would.
KernelPath path_from_env() {
  const char* e = env_get("EPMOE_KERNELS");
  if (e == nullptr || std::string(e) == "auto") return KernelPath::Auto;
  if (std::string(e) == "generic") return KernelPath::Generic;
  if (std::string(e) == "avx2") return KernelPath::Avx2;
  if (std::string(e) == "avx512") return KernelPath::Avx512;
  // Read before main: no exception can reach a handler here, so say it and stop as bad input does.
  std::fprintf(stderr, "epmoe: EPMOE_KERNELS=%s: expected auto, generic, avx2 or avx512\n", e);
  std::exit(2);
}
KernelPath g_path = path_from_env();

// ---- generic path: GCC vector extensions, 16 lanes, no FMA (same bits on AVX2 and baseline) ----

typedef float f32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

template <DType D>
inline f32x16 gload16(const void* w, int64_t k) {
  f32x16 v;
  if constexpr (D == DType::F32) {
    std::memcpy(&v, static_cast<const float*>(w) + k, 64);
  } else if constexpr (D == DType::BF16) {
    u16x16 h;
    std::memcpy(&h, static_cast<const uint16_t*>(w) + k, 32);
    u32x16 b = __builtin_convertvector(h, u32x16) << 16;
    std::memcpy(&v, &b, 64);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(w) + k;
    for (int i = 0; i < 16; i++) v[i] = f16_to_f32(p[i]);
  }
  return v;
}

template <DType D>
inline float gload1(const void* w, int64_t k) {
  if constexpr (D == DType::F32) return static_cast<const float*>(w)[k];
  else if constexpr (D == DType::BF16) return bf16_to_f32(static_cast<const uint16_t*>(w)[k]);
  else return f16_to_f32(static_cast<const uint16_t*>(w)[k]);
}

inline float greduce16(f32x16 a) {
  float s8[8], s4[4];
  for (int i = 0; i < 8; i++) s8[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// I8 rows (matmul_micro.h's definition), one lane at a time: std::fma where the vector kernels
// fuse, so that this path gives their bits (it is also the tests' reference).
void generic_i8_tile(int mr, int nr, const void* const* xv, const void* const* w, int64_t K, int64_t, int64_t, float*,
                     float* out) {  // no K blocks: always called over [0, K)
  const float* const* x = reinterpret_cast<const float* const*>(xv);
  const int64_t kb = K / kI8Block * kI8Block;
  for (int j = 0; j < nr; j++) {
    const CodeRow& r = *static_cast<const CodeRow*>(w[j]);
    const int8_t* q = reinterpret_cast<const int8_t*>(r.q);
    for (int i = 0; i < mr; i++) {
      float tot[16] = {};
      for (int64_t k = 0; k < kb; k += kI8Block) {
        const float s = code_block_scale(r, k / kI8Block);
        for (int l = 0; l < 16; l++) {
          const float p = x[i][k + l] * float(q[k + l]);
          tot[l] = std::fma(std::fma(x[i][k + 16 + l], float(q[k + 16 + l]), p), s, tot[l]);
        }
      }
      f32x16 t;
      std::memcpy(&t, tot, 64);
      float y = greduce16(t);
      for (int64_t k = kb; k < K; k++) y += x[i][k] * (float(q[k]) * code_block_scale(r, k / kI8Block));
      out[i * nr + j] = y;
    }
  }
}

template <DType D>
__attribute__((target_clones("avx2", "default")))
void generic_tile(int mr, int nr, const void* const* xv, const void* const* w, int64_t K, int64_t, int64_t, float*,
                  float* out) {  // no K blocks: always called over [0, K)
  const float* const* x = reinterpret_cast<const float* const*>(xv);
  const int64_t kv = K / 16 * 16;
  for (int j = 0; j < nr; j++) {
    f32x16 acc[kMaxMR] = {};
    for (int64_t k = 0; k < kv; k += 16) {
      const f32x16 wv = gload16<D>(w[j], k);
      for (int i = 0; i < mr; i++) {
        f32x16 xr;
        std::memcpy(&xr, x[i] + k, 64);
        acc[i] += xr * wv;
      }
    }
    for (int i = 0; i < mr; i++) {
      float s = greduce16(acc[i]);
      for (int64_t k = kv; k < K; k++) s += x[i][k] * gload1<D>(w[j], k);
      out[i * nr + j] = s;
    }
  }
}

const float* weight_row_check(const TensorView& W, const char* what) {
  if (W.rank() != 2) throw InputError(std::string(what) + " weight " + W.name + " must be 2-D, is " + W.shape_str());
  if (W.dtype == DType::F8_E4M3) {
    const BlockScale& s = W.scale;
    if (s.empty()) throw InputError("tensor '" + W.name + "' is F8_E4M3 without a weight_scale_inv");
    if (s.dtype != DType::F32 && s.dtype != DType::BF16)
      throw InputError("tensor '" + W.name + "': its weight_scale_inv has dtype " + std::string(dtype_name(s.dtype)) +
                       "; scales must be F32 or BF16");
    const int64_t N = W.shape[0], K = W.shape[1];
    if (s.block <= 0 || s.row0 < 0 || s.rows < (s.row0 + N + s.block - 1) / s.block || s.cols < (K + s.block - 1) / s.block)
      throw InputError("tensor '" + W.name + "' " + W.shape_str() + ": its weight_scale_inv grid [" +
                       std::to_string(s.rows) + ", " + std::to_string(s.cols) + "] (block " + std::to_string(s.block) +
                       ", rows from " + std::to_string(s.row0) + ") does not cover it");
    return nullptr;
  }
  if (W.dtype == DType::I8 && !W.scale.empty()) {
    const BlockScale& s = W.scale;
    const int64_t N = W.shape[0], K = W.shape[1];
    if (s.block != kI8Block || s.rows_per_scale() != 1 || s.row0 < 0 || s.rows < s.row0 + N ||
        s.cols < (K + s.block - 1) / s.block || (s.dtype != DType::F32 && s.dtype != DType::BF16))
      throw InputError("tensor '" + W.name + "' " + W.shape_str() + ": int8 rows need one F32 or BF16 scale per " +
                       std::to_string(kI8Block) + " columns of each row (tensor/quantize.h)");
    return nullptr;
  }
  if (!dtype_is_float_weight(W.dtype))
    throw InputError("tensor '" + W.name + "' has dtype " + std::string(dtype_name(W.dtype)) +
                     "; weights must be F32, BF16, F16, F8_E4M3 (with a weight_scale_inv) or int8 rows "
                     "(tensor/quantize.h)");
  return nullptr;
}

// Whether the fp8 micro-kernels may read W in place: 128 x 128 blocks and every scale s of the
// rows foldable (matmul_micro.h: s * 2^120 finite for the fp32 kernel, s * 2^-8 normal for the
// bf16 one; both hold for 2^-100 <= |s| < 2^8, s = 0 and s not finite). A few dozen scales per
// call; the rare weight that fails is dequantized row by row instead (exact, fp32 compute).
bool fp8_scales_fold(const TensorView& W) {
  const BlockScale& s = W.scale;
  if (s.block != kFp8Block) return false;
  const int64_t N = W.shape[0], K = W.shape[1];
  if (N == 0) return true;
  const int64_t r0 = s.row0 / s.rows_per_scale(), r1 = (s.row0 + N - 1) / s.rows_per_scale(),
                cols = (K + s.block - 1) / s.block;
  for (int64_t r = r0; r <= r1; r++)
    for (int64_t c = 0; c < cols; c++) {
      const size_t i = size_t(r * s.cols + c);
      const float v = s.dtype == DType::BF16 ? bf16_to_f32(static_cast<const uint16_t*>(s.data)[i])
                                             : static_cast<const float*>(s.data)[i];
      const float a = std::fabs(v);
      if (std::isfinite(a) && a != 0.0f && !(a >= 0x1p-100f && a < 0x1p8f)) return false;
    }
  return true;
}

// Activations in the form the micro-kernel reads: fp32 rows as they are, or rounded to bf16.
struct Activations {
  std::vector<uint16_t> bf16;
  const float* x;
  int64_t K;
  bool as_bf16;
  Activations(const float* x_, int64_t T, int64_t K_, bool as_bf16_) : x(x_), K(K_), as_bf16(as_bf16_) {
    if (!as_bf16) return;
    bf16.resize(size_t(T * K));
    for (int64_t i = 0; i < T * K; i++) bf16[size_t(i)] = f32_to_bf16(x[i]);
  }
  const void* row(int64_t t) const {
    return as_bf16 ? static_cast<const void*>(&bf16[size_t(t * K)]) : static_cast<const void*>(x + t * K);
  }
};

// Tokens per block: the block's activations stay in L2 while the weight rows stream past them.
constexpr int64_t kTokenBlock = 64;

// Up to this many tokens (decode: experts see one or two rows each) a tile is ONE weight row, so
// that each thread reads its weights as one sequential stream -- the way a STREAM loop reads.
// Measured on Zen 4 (one thread, bf16 weights, cold): 4 rows side by side (4 streams) 14-17 GB/s,
// one row at a time 20-23 GB/s; two threads 25 vs 31 GB/s, against 33 GB/s for STREAM. One row
// has one dependency chain per token (an FMA every 4 cycles: 8 bytes of bf16 weight per cycle),
// still more than a core's share of DRAM bandwidth at one or two tokens -- but not beyond: with
// T chains a tile is latency-bound, and at 3-8 tokens the 4 x 4 tiles read cold weights faster
// (2 threads, a 622 MB bf16 lm_head: 4 tokens 18-21 GB/s one row per tile against 31-35 tiled,
// 8 tokens 8-12 against 19-23). The fp8 and int8 kernels keep several rows per tile
// (Micro::stream_rows) and so their few-token form up to 8 tokens; so do the AVX2 kernels (Zen 3)
// and AVX-512 on Intel (CpuFeatures::few_token_rows), where one stream per thread was measured
// slower.
constexpr int64_t kStreamT = 2;
constexpr int64_t kCodeStreamT = 8;  // fp8 and int8 rows: several rows per tile (Micro::stream_rows)
inline int64_t stream_tokens(DType w) { return w == DType::F8_E4M3 || w == DType::I8 ? kCodeStreamT : kStreamT; }

// Tiled path (more tokens than stream_tokens): K is cut in blocks only beyond 4096; the lane
// accumulators of a token block then wait in a per-thread buffer between blocks (micro-kernel
// contract: the bits do not depend on the blocking). Blocks of 512 (fp32) / 1024 (bf16), meant to
// keep a tile's weight rows in L1, were measured slower on Zen 4 than one pass over K (2 threads,
// bf16 weights, K = 2048 and 4096, 32-512 tokens: fp32 170-250 against 220-300 GFLOP/s, bf16
// 260-395 against 320-455): the accumulators' round trips cost more than the hardware prefetcher
// loses streaming 16-32 KB of rows from L2.
constexpr int64_t kKBlock = 4096;
int64_t k_block(const Micro& m, int64_t T, int64_t K) {
  if (!m.k_blocks || T <= kMaxMR) return K;
  return kKBlock;
}

// How a tile's weight rows reach the micro-kernel. (bf16 rows are widened in the fp32 kernel's
// inner loop: widening them to fp32 once per token block instead was measured slower on Zen 4 --
// 175-200 against 235-250 GFLOP/s at 32-512 tokens.)
enum class RowForm {
  AsIs,        // the stored rows (F32, BF16, F16)
  Codes,       // CodeRow descriptors: the fp8 or int8 micro-kernel reads the codes in place
  Fp8Bf16,     // CodeRow descriptors with the codes widened to bf16 (q * 2^8) in a per-thread buffer
  Dequant,     // fp8 codes -> dequantized fp32 into a per-thread buffer (dequant_fn)
};

struct WeightRows {
  const char* base;
  size_t row_bytes;
  int64_t K;
  RowForm form = RowForm::AsIs;
  const BlockScale* scale = nullptr;  // F8_E4M3, I8
  RowDequantFn dequant_fn = nullptr;  // RowForm::Dequant

  WeightRows(const TensorView& W, RowForm f, RowDequantFn dq = nullptr)
      : base(static_cast<const char*>(W.data)), row_bytes(size_t(W.shape[1]) * dtype_size(W.dtype)), K(W.shape[1]),
        form(f), scale(&W.scale), dequant_fn(dq) {}

  CodeRow code_row(int64_t n) const {
    return {reinterpret_cast<const uint8_t*>(base + size_t(n) * row_bytes), scale->row(n), scale->dtype == DType::BF16};
  }

  const void* row(int64_t n, int slot) const {
    const char* r = base + size_t(n) * row_bytes;
    switch (form) {
      case RowForm::AsIs: return r;
      case RowForm::Codes: {
        thread_local CodeRow desc[kMaxNR];
        desc[slot] = code_row(n);
        return &desc[slot];
      }
      case RowForm::Fp8Bf16: {
        thread_local CodeRow desc[kMaxNR];
        thread_local std::vector<uint16_t> wide;
        wide.resize(size_t(kMaxNR) * size_t(K));
        desc[slot] = code_row(n);
        desc[slot].wide = &wide[size_t(slot) * size_t(K)];
        fp8_to_bf16_avx512(desc[slot].q, K, &wide[size_t(slot) * size_t(K)]);
        return &desc[slot];
      }
      case RowForm::Dequant: break;
    }
    thread_local std::vector<float> buf;
    buf.resize(size_t(kMaxNR) * size_t(K));
    float* dst = &buf[size_t(slot) * size_t(K)];
    dequant_fn(code_row(n), K, dst);
    return dst;
  }
};

struct Plan {
  Micro m;
  RowForm form;
  RowDequantFn dequant = nullptr;
};

// The micro-kernel for weights W at T tokens in `mode`, and the form its weight rows take.
Plan choose(const TensorView& W, int64_t T, ComputeMode mode) {
  if (W.dtype == DType::F8_E4M3) {
    // Few tokens: the fp8 kernel, reading one byte per weight. More: each tile's rows dequantized
    // once per token block (exact) and the fp32 kernel -- the conversion leaves the inner loop.
    // bf16 compute: the same split, the "-rows" kernel reading rows widened to bf16.
    if (fp8_scales_fold(W)) {
      const Micro m = select_micro(DType::F8_E4M3, mode);
      if (m.fn && T <= kCodeStreamT) return {m, RowForm::Codes};
      if (m.fn && m.x_bf16) return {avx512_bf16_fp8_rows_micro(), RowForm::Fp8Bf16};
    }
    const Micro f = select_micro(DType::F32, mode);
    const bool avx = std::string(f.name) == "avx512";
    return {f, RowForm::Dequant, avx ? &fp8_dequant_avx512 : &fp8_dequant_generic};
  }
  if (W.dtype == DType::I8) return {select_micro(DType::I8, mode), RowForm::Codes};  // every T: one arithmetic
  return {select_micro(W.dtype, mode), RowForm::AsIs};
}

// Prefetches part p of `parts` of the bytes [b, b + n) (cache lines, into L1).
inline void prefetch_part(const char* b, size_t n, int p, int parts) {
  const size_t lines = (n + 63) / 64, l0 = lines * size_t(p) / size_t(parts), l1 = lines * size_t(p + 1) / size_t(parts);
  for (size_t l = l0; l < l1; l++) __builtin_prefetch(b + l * 64, 0, 3);
}

// Drives tiles of (up to kMaxMR tokens) x (nr <= rows_per_tile weight rows) over [0, T) x
// [tile0, tile1), each tile over K in blocks of k_block(). rows_of(tile, ptrs) fills the weight-row
// pointers of a tile and returns nr; store(t0, mr, tile, nr, out) writes the results;
// prefetch(tile, part, parts) prefetches a slice of a tile's weight rows.

template <class RowsOf, class Store, class Prefetch>
void drive(const Micro& m, const Activations& a, int64_t T, int64_t tiles, int rows_per_tile, int64_t K, RowsOf rows_of,
           Store store, Prefetch prefetch, bool stream) {
  // Enough dot products per task to pay for a wake-up: ~64k multiply-adds.
  const int64_t min_tiles = std::max<int64_t>(
      1, 65536 / std::max<int64_t>(1, K * std::min<int64_t>(T, kTokenBlock) * rows_per_tile));
  const int64_t kb = std::max<int64_t>(1, k_block(m, T, K));
  parallel_for(tiles, min_tiles, [&](int64_t b, int64_t e) {
    const void* w[kMaxNR];
    const void* x[kMaxMR];
    float out[kMaxMR * kMaxNR];
    thread_local std::vector<float> acc;  // lane accumulators of a token block between K blocks
    if (kb < K) acc.resize(size_t(kTokenBlock) * kMaxNR * 16);
    for (int64_t tb = 0; tb < T; tb += kTokenBlock) {
      const int64_t te = std::min(T, tb + kTokenBlock);
      const int parts = std::max(1, int((te - tb + kMaxMR - 1) / kMaxMR) * int((K + kb - 1) / kb));
      // Tiled path: while the micro-tiles of one tile run, the next tile's weight rows are fetched
      // from DRAM, a slice before each micro-tile (cold experts: measured 226 -> 256 GFLOP/s on
      // the 512-token bf16 layer). One-row tiles (few tokens) leave it to the hardware prefetcher.
      const bool pf = !stream;
      for (int64_t tile = b; tile < e; tile++) {
        const int nr = rows_of(tile, w);
        int part = 0;
        for (int64_t k0 = 0;; k0 += kb) {
          const int64_t k1 = std::min(K, k0 + kb);
          for (int64_t t0 = tb; t0 < te; t0 += kMaxMR) {
            const int mr = int(std::min<int64_t>(kMaxMR, te - t0));
            if (pf && tile + 1 < e) prefetch(tile + 1, part++, parts);
            for (int i = 0; i < mr; i++) x[i] = a.row(t0 + i);
            m.fn(mr, nr, x, w, K, k0, k1, kb < K ? &acc[size_t(t0 - tb) * kMaxNR * 16] : nullptr, out);
            if (k1 == K) store(t0, mr, tile, nr, out);
          }
          if (k1 >= K) break;
        }
      }
    }
  });
}

}  // namespace

// ---- path selection (matmul_micro.h) ----

Micro select_micro(DType w, ComputeMode mode) {
  const CpuFeatures& cpu = cpu_features();
  const bool avx512 = (g_path == KernelPath::Auto || g_path == KernelPath::Avx512) && cpu.avx512;
  const bool avx2 = g_path != KernelPath::Generic && cpu.avx2 && cpu.fma;
  if (avx512 && mode == ComputeMode::BF16 && cpu.avx512_bf16) {
    Micro m = avx512_bf16_micro(w);
    if (m.fn) return m;
  }
  if (avx512) {
    Micro m = avx512_micro(w);
    if (m.fn) return m;
  }
  if (avx2) {
    Micro m = avx2_micro(w);
    if (m.fn) return m;
  }
  return generic_micro(w);
}

Micro generic_micro(DType w) {
  switch (w) {
    case DType::F32: return {&generic_tile<DType::F32>, false, false, "generic"};
    case DType::BF16: return {&generic_tile<DType::BF16>, false, false, "generic"};
    case DType::F16: return {&generic_tile<DType::F16>, false, false, "generic"};
    case DType::I8: return {&generic_i8_tile, false, false, "generic", kMaxNR};
    default: return {};
  }
}

__attribute__((target_clones("avx2", "default"))) void fp8_dequant_generic(const CodeRow& r, int64_t K, float* dst) {
  typedef int8_t i8x16 __attribute__((vector_size(16)));
  typedef int32_t i32x16 __attribute__((vector_size(64)));
  for (int64_t b = 0; b * kFp8Block < K; b++) {
    const float s = code_block_scale(r, b), s120 = s * 0x1p120f;
    const int64_t k0 = b * kFp8Block, k1 = std::min(K, k0 + kFp8Block);
    int64_t k = k0;
    if (!std::isinf(s120) || std::isinf(s)) {  // the scale folds (matmul_micro.h): one multiply
      for (; k + 16 <= k1; k += 16) {
        i8x16 c;
        std::memcpy(&c, r.q + k, 16);
        const i32x16 v = __builtin_convertvector(c, i32x16);  // sign-extended: bits 27..31 = sign
        // The codes' second form (matmul_micro.h): q * 2^-112, never a subnormal operand (Intel
        // stalls on those), times s * 2^112 -- finite whenever s * 2^120 is; the same bits.
        const u32x16 t = u32x16(v) << 20, mag = t & kFp8Mag;
        const i32x16 e0 = (mag & kFp8Exp) == 0;  // all ones on zero / subnormal codes
        const u32x16 bits = mag + kFp8Bias112 + (u32x16(e0) & (1u << 23));
        f32x16 f;
        std::memcpy(&f, &bits, 64);
        const f32x16 none = {}, sub = none + kFp8Sub112;
        f -= e0 ? sub : none;  // - (+0) elsewhere: exact for the positive magnitudes
        u32x16 fb;
        std::memcpy(&fb, &f, 64);
        fb |= t & 0x80000000u;
        std::memcpy(&f, &fb, 64);
        f *= s * fp8_fold(true);
        u32x16 out;
        std::memcpy(&out, &f, 64);
        const u32x16 nan = u32x16((v & 0x7f) == 0x7f);  // all ones on the NaN codes
        out = (out & ~nan) | (0x7fc00000u & nan);
        std::memcpy(dst + k, &out, 64);
      }
    }
    for (; k < k1; k++) dst[k] = fp8e4m3_to_f32(r.q[k]) * s;
  }
}

void set_kernel_path(KernelPath p) { g_path = p; }

std::string kernel_description(ComputeMode mode) {
  const Micro f8 = select_micro(DType::F8_E4M3, mode);
  return std::string(select_micro(DType::BF16, mode).name) + " for bf16 weights, " +
         (f8.fn ? f8.name : "dequantized rows") + " for fp8, " + select_micro(DType::F32, mode).name +
         " for f32 (CPU: " + cpu_features_string() + ")";
}

void matmul(const float* x, int64_t T, const TensorView& W, float* y, ComputeMode mode, const float* bias) {
  weight_row_check(W, "matmul");
  const int64_t N = W.shape[0], K = W.shape[1];
  if (T == 0 || N == 0) return;
  const Plan plan = choose(W, T, mode);
  const Micro& m = plan.m;
  const Activations a(x, T, K, m.x_bf16);
  const WeightRows rows(W, plan.form, plan.dequant);
  const bool stream = T <= stream_tokens(W.dtype);
  const int R = stream ? m.stream_rows : kMaxNR;  // weight rows per tile
  const int64_t tiles = (N + R - 1) / R;
  if (stream && R > 1) {
    // Few tokens, several rows per tile (Micro::stream_rows): rows far apart, tile t holds rows
    // t, t + tiles, t + 2 tiles ... -- a thread's tiles then read R sequential runs of rows.
    // (Adjacent rows side by side were measured far slower on Zen 4 -- fp8, one thread, cold:
    // 2 adjacent rows 6 GB/s, 1 row 9, 2 rows N/2 apart 15.)
    drive(
        m, a, T, tiles, R, K,
        [&](int64_t tile, const void** w) {
          int nr = 0;
          for (; nr < R && tile + nr * tiles < N; nr++) w[nr] = rows.row(tile + nr * tiles, nr);
          return nr;
        },
        [&](int64_t t0, int mr, int64_t tile, int nr, const float* out) {
          for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) {
              const int64_t n = tile + j * tiles;
              y[(t0 + i) * N + n] = out[i * nr + j] + (bias ? bias[n] : 0.0f);
            }
        },
        [](int64_t, int, int) {}, true);
    return;
  }
  drive(
      m, a, T, tiles, R, K,
      [&](int64_t tile, const void** w) {
        const int64_t n0 = tile * R;
        const int nr = int(std::min<int64_t>(R, N - n0));
        for (int j = 0; j < nr; j++) w[j] = rows.row(n0 + j, j);
        return nr;
      },
      [&](int64_t t0, int mr, int64_t tile, int nr, const float* out) {
        const int64_t n0 = tile * R;
        if (nr == kMaxNR) {
          // Full tile: each output row is kMaxNR consecutive floats, written as one vector (the
          // same adds as below, bias or +0.0f). The general loop, with nr known only at run time,
          // was measured to cost 8-10% of the down projection at 32 tokens.
          float b[kMaxNR] = {};
          if (bias) std::memcpy(b, bias + n0, sizeof b);
          for (int i = 0; i < mr; i++) {
            float r[kMaxNR];
            for (int j = 0; j < kMaxNR; j++) r[j] = out[i * kMaxNR + j] + b[j];
            std::memcpy(&y[(t0 + i) * N + n0], r, sizeof r);
          }
          return;
        }
        for (int i = 0; i < mr; i++)
          for (int j = 0; j < nr; j++) y[(t0 + i) * N + n0 + j] = out[i * nr + j] + (bias ? bias[n0 + j] : 0.0f);
      },
      [&](int64_t tile, int part, int parts) {
        const int64_t n0 = tile * R;
        prefetch_part(rows.base + size_t(n0) * rows.row_bytes, size_t(std::min<int64_t>(R, N - n0)) * rows.row_bytes, part,
                      parts);
      },
      stream);
}

void matmul_swiglu(const float* x, int64_t T, const TensorView& Wg, const TensorView& Wu, float* h, ComputeMode mode) {
  weight_row_check(Wg, "swiglu");
  weight_row_check(Wu, "swiglu");
  EPMOE_ASSERT(Wg.shape == Wu.shape && Wg.dtype == Wu.dtype, "gate and up weights differ: " + Wg.name + " vs " + Wu.name);
  const int64_t I = Wg.shape[0], K = Wg.shape[1];
  if (T == 0 || I == 0) return;
  // One plan for both (an fp8 pair takes the in-place kernel only if both sets of scales fold):
  // each output element is then the same dot product as in matmul with its own weight.
  Plan plan = choose(Wg, T, mode);
  if (Wg.dtype == DType::F8_E4M3) {
    const Plan pu = choose(Wu, T, mode);
    if (pu.form != plan.form) plan = pu.form == RowForm::Dequant ? pu : plan;
  }
  const Micro& m = plan.m;
  const Activations a(x, T, K, m.x_bf16);
  const size_t row_bytes = size_t(K) * dtype_size(Wg.dtype);
  const WeightRows g(Wg, plan.form, plan.dequant);
  const WeightRows u(Wu, plan.form, plan.dequant);
  const bool stream = T <= stream_tokens(Wg.dtype);
  if (stream && m.stream_rows > 1) {
    // Few tokens, several rows per tile (Micro::stream_rows: the one-byte-code kernels, the AVX2
    // kernels, and AVX-512 on Intel -- CpuFeatures::few_token_rows): a tile holds gate
    // and up rows of the same columns, P = stream_rows / 2 columns far apart (t, t + tiles, ...;
    // see matmul above): 2P sequential runs of rows per thread, silu(g) * u formed in the store.
    const int P = m.stream_rows / 2;
    const int64_t tiles = (I + P - 1) / P;
    drive(
        m, a, T, tiles, 2 * P, K,
        [&](int64_t tile, const void** w) {
          int nc = 0;
          for (; nc < P && tile + nc * tiles < I; nc++) {
            w[2 * nc] = g.row(tile + nc * tiles, 2 * nc);
            w[2 * nc + 1] = u.row(tile + nc * tiles, 2 * nc + 1);
          }
          return 2 * nc;
        },
        [&](int64_t t0, int mr, int64_t tile, int nr, const float* out) {
          for (int i = 0; i < mr; i++)
            for (int c = 0; c < nr / 2; c++)
              h[(t0 + i) * I + tile + c * tiles] = silu(out[i * nr + 2 * c]) * out[i * nr + 2 * c + 1];
        },
        [](int64_t, int, int) {}, true);
    return;
  }
  if (stream) {
    // Few tokens: one weight row per tile (see kStreamT), in blocks of kCols columns: the block's
    // gate rows, then its up rows -- two sequential runs of kCols rows -- into g and u, then
    // silu(g) * u. Each element is the same dot product as in the fused tiles below.
    constexpr int64_t kCols = 16;
    thread_local std::vector<float> gu;
    gu.resize(size_t(2 * T * I));
    float* gy = gu.data();
    float* uy = gy + T * I;
    // Virtual row v: block v / (2 kCols); within it, gate rows first, then up rows.
    auto decode = [&](int64_t v, bool& up) {
      const int64_t blk = v / (2 * kCols), r = v - blk * 2 * kCols;
      const int64_t nb = std::min<int64_t>(kCols, I - blk * kCols);
      up = r >= nb;
      return blk * kCols + (up ? r - nb : r);
    };
    drive(
        m, a, T, 2 * I, 1, K,
        [&](int64_t v, const void** w) {
          bool up;
          const int64_t n = decode(v, up);
          w[0] = (up ? u : g).row(n, 0);
          return 1;
        },
        [&](int64_t t0, int mr, int64_t v, int, const float* out) {
          bool up;
          const int64_t n = decode(v, up);
          float* dst = up ? uy : gy;
          for (int i = 0; i < mr; i++) dst[(t0 + i) * I + n] = out[i];
        },
        [](int64_t, int, int) {}, true);
    for (int64_t i = 0; i < T * I; i++) h[i] = silu(gy[i]) * uy[i];
    return;
  }
  // A tile holds gate and up rows of the same output columns: {g[n], g[n+1], u[n], u[n+1]}, so the
  // pass over x serves both and silu(g) * u is formed in registers' reach.
  constexpr int kCols = kMaxNR / 2;
  const int64_t tiles = (I + kCols - 1) / kCols;
  drive(
      m, a, T, tiles, kMaxNR, K,
      [&](int64_t tile, const void** w) {
        const int64_t n0 = tile * kCols;
        const int nc = int(std::min<int64_t>(kCols, I - n0));
        for (int j = 0; j < nc; j++) {
          w[j] = g.row(n0 + j, j);
          w[nc + j] = u.row(n0 + j, nc + j);
        }
        return 2 * nc;
      },
      [&](int64_t t0, int mr, int64_t tile, int nr, const float* out) {
        const int64_t n0 = tile * kCols;
        const int nc = nr / 2;
        for (int i = 0; i < mr; i++)
          for (int j = 0; j < nc; j++) h[(t0 + i) * I + n0 + j] = silu(out[i * nr + j]) * out[i * nr + nc + j];
      },
      [&](int64_t tile, int part, int parts) {
        const int64_t n0 = tile * kCols;
        const size_t bytes = size_t(std::min<int64_t>(kCols, I - n0)) * row_bytes;
        prefetch_part(g.base + size_t(n0) * row_bytes, bytes, part, parts);
        prefetch_part(u.base + size_t(n0) * row_bytes, bytes, part, parts);
      },
      false);
}

void matmul_ref(const float* x, int64_t T, const TensorView& W, float* y, const float* bias) {
  const int64_t N = W.shape[0], K = W.shape[1];
  for (int64_t t = 0; t < T; t++)
    for (int64_t n = 0; n < N; n++) {
      double s = bias ? bias[n] : 0.0;
      for (int64_t k = 0; k < K; k++) s += double(x[t * K + k]) * double(W.at(n * K + k));
      y[t * N + n] = float(s);
    }
}

}  // namespace epmoe
