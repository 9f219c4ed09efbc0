// Random inputs and bit-for-bit comparisons the tests share. One definition here, not one per test
// file: the sanitizer build compiles a layer's test files as one unity batch (scripts/test-sanitize.sh),
// where two files' copies of a helper collide.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace epmoe::test {

// n draws of N(0, scale^2) from rng (scale 1: the standard normal).
inline std::vector<float> randn(std::mt19937& rng, int64_t n, float scale = 1.f) {
  std::normal_distribution<float> g(0.f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = g(rng);
  return v;
}

// The same floats, bit for bit (NaNs and signed zeros included).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // (memcmp of two empty vectors' null data() is undefined: UBSan says so)
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace epmoe::test
