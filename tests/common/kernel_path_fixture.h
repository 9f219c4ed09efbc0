// The kernel-path fixture the kernel tests share: each case forces one CPU path (kernels/matmul.h)
// and names the compute mode its products pass (mode()), is skipped where the CPU lacks the path,
// and restores the defaults after.
#pragma once

#include <gtest/gtest.h>

#include <ostream>

#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "util/threads.h"

namespace epmoe::test {

struct PathMode {
  KernelPath path;
  ComputeMode mode;
  const char* name;
};
inline void PrintTo(const PathMode& c, std::ostream* os) { *os << c.name; }

class KernelPathTest : public ::testing::TestWithParam<PathMode> {
 protected:
  void SetUp() override {
    const CpuFeatures& cpu = cpu_features();
    const PathMode& c = GetParam();
    if (c.path == KernelPath::Avx512 && !cpu.avx512) GTEST_SKIP() << "CPU without AVX-512";
    if (c.path == KernelPath::Avx2 && !(cpu.avx2 && cpu.fma)) GTEST_SKIP() << "CPU without AVX2 + FMA";
    set_kernel_path(c.path);
  }
  void TearDown() override {
    set_kernel_path(KernelPath::Auto);
    set_num_threads(0);
  }
  // The compute mode of this case, for every product the test computes.
  ComputeMode mode() const { return GetParam().mode; }
};

}  // namespace epmoe::test
