// Access to the fixtures under tests/data: model folders and their golden.safetensors
// (what transformers computed; see tests/data/FIXTURES.md).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace epmoe::test {

// EPMOE_TEST_DATA from the environment, else the checkout the binary was built from, else
// tests/data under the working directory: the GPU tests run on another machine, from the root of
// a copy of the checkout at another path (scripts/gpu-test.sh), where the built-in path is absent.
inline std::string data_dir() {
  if (const char* e = std::getenv("EPMOE_TEST_DATA"); e && *e) return e;
  if (std::filesystem::is_directory(EPMOE_TEST_DATA)) return EPMOE_TEST_DATA;
  return "tests/data";
}
inline std::string fixture(const std::string& name) { return data_dir() + "/" + name; }

// The model fixtures with goldens, by folder name.
inline std::vector<std::string> qwen3_fixtures() { return {"qwen3moe-tiny", "qwen3moe-tiny-mixed-bf16", "qwen3moe-tiny-v5"}; }
// Multi-head latent attention families (DeepSeek-V2/V3, GLM-4.7-Flash) and FP8 checkpoints.
inline std::vector<std::string> mla_fixtures() {
  return {"deepseek-v2-lite-tiny", "deepseek-v2-tiny", "deepseek-v3-tiny", "glm4moe-lite-tiny"};
}
inline std::vector<std::string> fp8_fixtures() { return {"qwen3moe-fp8-tiny", "deepseek-v3-fp8-tiny"}; }
inline std::vector<std::string> all_model_fixtures() {
  return {"qwen3moe-tiny", "qwen3moe-tiny-mixed-bf16", "qwen3moe-tiny-v5", "qwen2moe-tiny", "glm4moe-tiny", "mixtral-tiny",
          "deepseek-v2-lite-tiny", "deepseek-v2-tiny", "deepseek-v3-tiny", "glm4moe-lite-tiny", "qwen3moe-fp8-tiny",
          "deepseek-v3-fp8-tiny"};
}

// The gtest name of a test parameterised by a fixture folder: the folder with '-' as '_'.
struct FixtureName {
  template <class Info>
  std::string operator()(const Info& info) const {
    std::string n = info.param;
    for (auto& c : n)
      if (c == '-') c = '_';
    return n;
  }
};

struct Golden {
  SafetensorsFile file;
  explicit Golden(const std::string& fixture_name) : file(fixture(fixture_name) + "/golden.safetensors") {}
  int sequences() const {
    int n = 0;
    while (file.contains("seq" + std::to_string(n) + ".all_ids")) n++;
    return n;
  }
  std::vector<int32_t> ids(const std::string& key) const {
    TensorView v = file.get(key);
    std::vector<int32_t> out;
    for (int64_t i = 0; i < v.numel(); i++) out.push_back(int32_t(static_cast<const int64_t*>(v.data)[i]));
    return out;
  }
  std::vector<float> f32(const std::string& key) const { return to_f32(file.get(key)); }
  bool has(const std::string& key) const { return file.contains(key); }
};

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  float m = 0.f;
  for (size_t i = 0; i < a.size(); i++) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

}  // namespace epmoe::test
