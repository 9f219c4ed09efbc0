// CPU features, detected once at run time (never assumed at compile time: CI machines differ).
#pragma once

#include <string>

namespace epmoe {

struct CpuFeatures {
  bool avx2 = false, fma = false;
  bool avx512 = false;       // F + BW + VL
  bool avx512_bf16 = false;  // vdpbf16ps
};

const CpuFeatures& cpu_features();
std::string cpu_features_string();

}  // namespace epmoe
