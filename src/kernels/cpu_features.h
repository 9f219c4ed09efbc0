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
};

const CpuFeatures& cpu_features();
// Tests only: run the kernels chosen for CPUs with (or without) subnormal assists on this one.
void set_subnormal_assists_for_tests(bool on);
std::string cpu_features_string();

}  // namespace epmoe
