#include "kernels/cpu_features.h"

namespace epmoe {

namespace {

// Detected once; a plain (non-const) object so that set_subnormal_assists_for_tests may write it.
CpuFeatures& detected() {
  static CpuFeatures f = [] {
    CpuFeatures c;
    __builtin_cpu_init();
    c.avx2 = __builtin_cpu_supports("avx2");
    c.fma = __builtin_cpu_supports("fma");
    c.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
    c.avx512_bf16 = c.avx512 && __builtin_cpu_supports("avx512bf16");
    const bool intel = __builtin_cpu_is("intel");
    c.subnormal_assists = intel;
    c.few_token_rows = intel ? 4 : 1;
    c.bf16_dot_by_fma = intel && c.avx512_bf16;
    return c;
  }();
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() { return detected(); }

void set_subnormal_assists_for_tests(bool on) { detected().subnormal_assists = on; }
void set_few_token_rows_for_tests(int rows) { detected().few_token_rows = rows; }
void set_bf16_dot_by_fma_for_tests(bool on) { detected().bf16_dot_by_fma = on; }

std::string cpu_features_string() {
  const CpuFeatures& c = cpu_features();
  std::string s;
  if (c.avx512_bf16) s = "AVX-512 + AVX512-BF16";
  else if (c.avx512) s = "AVX-512";
  else if (c.avx2) s = "AVX2";
  else s = "baseline x86-64";
  return s;
}

}  // namespace epmoe
