// --check-numerics (stop at the first layer whose output holds NaN or Inf, and name it) and
// --check-weights (scan the weights a rank loads for NaN/Inf, and name the tensor), on copies of
// the fixtures with one poisoned weight.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/run.h"
#include "common/safetensors_edit.h"
#include "common/scratch.h"

namespace epmoe {
namespace {

using test::RawSafetensors;
using test::Scratch;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

void poison(const Scratch& s, const std::string& file, const std::string& tensor, int64_t element, float value) {
  RawSafetensors st = RawSafetensors::read(s.path(file));
  st.set_value(tensor, element, value);
  st.write(s.path(file));
}

std::string generate_with(const Scratch& s, const std::string& flags) {
  return test::epmoe() + " generate --model " + s.dir() + " --prompt-ids 1,2,3,4 --max-new-tokens 3 " + flags;
}

// The whole output is the one error line.
void expect_one_line(const test::RunResult& r, int code, const std::string& line) {
  EXPECT_EQ(r.exit_code, code) << r.output;
  EXPECT_EQ(r.output, line + "\n");
}

TEST(CheckNumerics, NamesTheFirstLayerWithNaN) {
  Scratch s("qwen3moe-tiny");
  // A NaN in the attention output projection of layer 1: layer 0 stays finite, layer 1 does not.
  poison(s, "model.safetensors", "model.layers.1.self_attn.o_proj.weight", 0, kNaN);
  const auto r = test::run_command(generate_with(s, "--check-numerics"));
  EXPECT_EQ(r.exit_code, 1) << r.output;  // a failed check, not bad input
  EXPECT_EQ(r.output.rfind("epmoe: error: --check-numerics: layer 1 (MoE) produced NaN", 0), 0u) << r.output;
}

TEST(CheckNumerics, NamesTheFirstLayerWithInf) {
  Scratch s("qwen3moe-tiny");
  poison(s, "model.safetensors", "model.layers.2.self_attn.v_proj.weight", 5, kInf);
  const auto r = test::run_command(generate_with(s, "--check-numerics"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output.rfind("epmoe: error: --check-numerics: layer 2 (MoE) produced ", 0), 0u) << r.output;
}

TEST(CheckWeights, NamesTheTensorTheFileAndTheElement) {
  Scratch s("qwen3moe-tiny");
  poison(s, "model.safetensors", "model.layers.1.self_attn.o_proj.weight", 70, kNaN);
  expect_one_line(test::run_command(generate_with(s, "--check-weights")), 2,
                  "epmoe: error: --check-weights: tensor 'model.layers.1.self_attn.o_proj.weight' in " +
                      s.path("model.safetensors") + " holds NaN at element 70 of shape [64, 64]");
}

TEST(CheckWeights, FindsInfInBf16Shards) {
  Scratch s("qwen3moe-tiny-mixed-bf16");
  const std::string shard = "model-00002-of-00002.safetensors";
  const std::string tensor = "model.layers.3.mlp.down_proj.weight";  // BF16, in shard 2
  poison(s, shard, tensor, 9, -kInf);
  const auto r = test::run_command(generate_with(s, "--check-weights"));
  expect_one_line(r, 2, "epmoe: error: --check-weights: tensor '" + tensor + "' in " + s.path(shard) +
                            " holds -Inf at element 9 of shape [64, 96]");
}

// transformers v5 fuses the experts of a layer into one tensor; a rank scans only its slices.
TEST(CheckWeights, ScansOnlyTheExpertsOfEachRank) {
  Scratch s("qwen3moe-tiny-v5");
  const std::string fused = "model.layers.0.mlp.experts.gate_up_proj";  // [8, 2I, H]
  const auto shape = RawSafetensors::read(s.path("model.safetensors")).entry(fused)["shape"];
  const int64_t per_expert = shape[1].get<int64_t>() * shape[2].get<int64_t>();
  poison(s, "model.safetensors", fused, 6 * per_expert + 3, kInf);  // expert 6: rank 1's at R = 2

  expect_one_line(test::run_command(generate_with(s, "--check-weights")), 2,
                  "epmoe: error: --check-weights: tensor '" + fused + "[6]' in " + s.path("model.safetensors") +
                      " holds +Inf at element 3 of shape " + "[" + std::to_string(shape[1].get<int64_t>()) + ", " +
                      std::to_string(shape[2].get<int64_t>()) + "]");

  const auto r = test::run_command(test::mpirun(2) + generate_with(s, "--check-weights --comm-timeout 10"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("epmoe: rank 1: error: --check-weights: tensor '" + fused + "[6]'"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("rank 0: error"), std::string::npos) << "expert 6 is not rank 0's: " << r.output;
}

TEST(CheckWeights, PassesTheCleanFixtures) {
  for (const auto& name : test::all_model_fixtures()) {
    const auto r = test::run_command(test::epmoe() + " generate --model " + test::fixture(name) +
                                     " --prompt-ids 1,2,3 --max-new-tokens 2 --check-weights --check-numerics");
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.output;
  }
}

}  // namespace
}  // namespace epmoe
