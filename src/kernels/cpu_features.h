// CPU features, detected once at run time (never assumed at compile time: CI machines differ).
#pragma once

#include <string>

namespace epmoe {

struct CpuFeatures {
  bool avx2 = false, fma = false;
  bool avx512 = false;       // F + BW + VL
  bool avx512_bf16 = false;  // vdpbf16ps
  // Intel cores take a microcode assist on a vector multiply with a subnormal input (~100+ cycles;
  // AMD's Zen cores measured none worth a detour): the exact fp8 kernels then avoid such inputs.
  bool subnormal_assists = false;
  // Weight rows a thread reads side by side in the AVX-512 path's few-token (decode) tiles of
  // F32 / BF16 weights -- rows far apart, so R sequential streams per thread (matmul.cc). Measured
  // both ways: Zen 4 reads one stream fastest (1 row 20-23 GB/s a thread, 4 rows 14-17); the
  // device host's Xeon (2 pinned cores, bf16 lm_head of the 4-layer synthesized Qwen3-30B-A3B,
  // decode 64 @512, 3 cycles) 51.3 ms with 1 row, 38.9 with 2, 36.9 with 4 (next-row software
  // prefetch: no change). So 4 on Intel, 1 elsewhere; the AVX2 path keeps its 4 (Zen 3 measured).
  int few_token_rows = 1;
  // --compute bf16 through vdpbf16ps's arithmetic written as two FMAs per pair (matmul_avx512.cc
  // micro_bf16 with kByFma: the instruction's bits). On the device host's Xeon (Sapphire Rapids class)
  // vdpbf16ps peaks at half the fp32 FMA rate (moe_bench: 145-155 against 293-332 GFLOP/s on 2
  // cores), and prefill 512 of the 4-layer synthesized Qwen3-30B-A3B ran 239 tok/s with the FMAs
  // against 195 with the instruction (medians of 3 interleaved cycles). Zen 4 keeps the instruction
  // (its peak there: 823 against 444). So Intel, where AVX512-BF16 exists.
  bool bf16_dot_by_fma = false;
};

const CpuFeatures& cpu_features();
// Tests only: run the kernels chosen for CPUs with (or without) subnormal assists on this one.
void set_subnormal_assists_for_tests(bool on);
// Tests only: the AVX-512 path's few-token rows per tile (1 to 4), to run the other CPUs' layout here.
void set_few_token_rows_for_tests(int rows);
// Tests only: --compute bf16 through the FMA form of vdpbf16ps (true) or the instruction (false).
void set_bf16_dot_by_fma_for_tests(bool on);
std::string cpu_features_string();

}  // namespace epmoe
