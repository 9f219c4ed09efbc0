// `epmoe check` honours or refuses every run option it accepts (issue 36: it used to build its own
// models without the KV pool, lm_head and --check-numerics settings, and so ignored them). Each
// option is shown to act by an outcome that depends on it: a pool too small refused, a block size
// that makes the same pool fit, a quantized lm_head failing against an exact reference file, a
// poisoned weight found by --check-numerics, the CPU's refusals of GPU-only settings.
#include <gtest/gtest.h>

#include <limits>

#include "common/run.h"
#include "common/safetensors_edit.h"
#include "common/scratch.h"

namespace epmoe {
namespace {

// Prompts of 16 tokens + 8 generated (24 positions scored per sequence), one backend: seconds.
std::string check(const std::string& model, const std::string& flags, int prompts = 2) {
  return test::epmoe() + " check --model " + model + " --prompts " + std::to_string(prompts) +
         " --prompt-len 16 --gen-tokens 8 --moe-a2a-backend none " + flags;
}

TEST(CheckOptions, EveryRunOptionActsOrIsRefused) {
  const std::string m = test::fixture("qwen3moe-tiny");
  const auto plain = test::run_command(check(m, ""));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;

  // --kv-cache-tokens: a pool of 8 positions cannot hold a sequence of 23: refused, naming the flag.
  auto r = test::run_command(check(m, "--kv-cache-tokens 8"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--kv-cache-tokens"), std::string::npos) << r.output;
  // --kv-block-size: the pool is whole blocks (rounded up): 20 positions are 5 blocks of 4 (too
  // few for one sequence's 24) but 1 block of 32 (enough).
  r = test::run_command(check(m, "--kv-cache-tokens 20 --kv-block-size 4", 1));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = test::run_command(check(m, "--kv-cache-tokens 20 --kv-block-size 32", 1));
  EXPECT_EQ(r.exit_code, 0) << r.output;

  // --lm-head int8: against a reference of the checkpoint's own head (a file `score` wrote) the
  // quantized head's logits differ: the check fails (1); with the exact head it passes.
  test::Scratch s("qwen3moe-tiny");
  const std::string ref = s.path("ref.safetensors");
  r = test::run_command(test::epmoe() + " score --model " + m + " --ids 5,17,42,99,3,8,1 --out " + ref);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = test::run_command(check(m, "--reference " + ref));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = test::run_command(check(m, "--reference " + ref + " --lm-head int8"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("check: FAILED"), std::string::npos) << r.output;

  // --check-numerics: a NaN in layer 1 is found and named (exit 1), in the reference's first step.
  test::RawSafetensors st = test::RawSafetensors::read(s.path("model.safetensors"));
  st.set_value("model.layers.1.self_attn.o_proj.weight", 0, std::numeric_limits<float>::quiet_NaN());
  st.write(s.path("model.safetensors"));
  r = test::run_command(check(s.dir(), "--check-numerics"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--check-numerics: layer 1 (MoE) produced NaN"), std::string::npos) << r.output;

  // GPU-only settings are refused on the CPU, naming the flag (as generate refuses them).
  r = test::run_command(check(m, "--kv-cache-dtype bf16"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--kv-cache-dtype bf16"), std::string::npos) << r.output;
  r = test::run_command(check(m, "--mem-fraction 0.5"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--mem-fraction"), std::string::npos) << r.output;
  r = test::run_command(check(m, "--fp8-compute tensor-core"));
  EXPECT_EQ(r.exit_code, 2) << r.output;

  // What check always does anyway: the reduction audit of every backend (--audit), batch-invariant
  // kernels (--batch-invariant). Accepted, the same verdict.
  r = test::run_command(check(m, "--audit --batch-invariant"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace epmoe
