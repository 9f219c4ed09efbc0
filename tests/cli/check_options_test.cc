// `epmoe check` honours or refuses every run option it accepts (issue 36: it used to build its own
// models without the KV pool, lm_head and --check-numerics settings, and so ignored them). Each
// option is shown to act by an outcome that depends on it: a pool too small refused, a block size
// that makes the same pool fit, a quantized lm_head failing against an exact reference file, a
// poisoned weight found by --check-numerics, the CPU's refusals of GPU-only settings; and, since
// check builds its runtimes through make_runtime, every other run option the same way (the second
// and third tests). --threads and --chunk-tokens are accepted with no test here: by design neither
// changes a bit of the output (the worker pool, the fused backend's pipelining), so no outcome of
// check can show them.
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "common/run.h"
#include "common/safetensors_edit.h"
#include "common/scratch.h"
#include "kernels/cpu_features.h"
#include "tensor/device.h"

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

// The audit's tokens per rank at R = 1, from the --json report of one backend.
int64_t audit_tokens(const std::string& json_path) {
  const nlohmann::json j = nlohmann::json::parse(test::read_file(json_path));
  return j["backends"][0]["audit"]["tokens"].get<int64_t>();
}

TEST(CheckOptions, PlacementCombineCapacityWeightsComputeAndDeviceActOrAreRefused) {
  const std::string m = test::fixture("qwen3moe-tiny");
  test::Scratch s("qwen3moe-tiny");

  // --max-dispatch-tokens-per-rank: the audit takes capacity + 5 tokens a rank (a bounded backend's
  // second round), so the report's count follows the flag.
  auto r = test::run_command(check(m, "--json " + s.path("a.json")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(audit_tokens(s.path("a.json")), 128 + 5);
  r = test::run_command(check(m, "--max-dispatch-tokens-per-rank 3 --json " + s.path("b.json")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(audit_tokens(s.path("b.json")), 3 + 5);

  // --combine fast: the check's criterion becomes the fast combine's tolerance (the report says so).
  r = test::run_command(check(m, "--combine fast --json " + s.path("c.json")));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(", fast combine,"), std::string::npos) << r.output;
  EXPECT_EQ(nlohmann::json::parse(test::read_file(s.path("c.json")))["combine"], "fast");

  // --ep-redundant-experts and --placement reach the placement: refused when impossible.
  r = test::run_command(check(m, "--ep-redundant-experts 1000"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--ep-redundant-experts 1000"), std::string::npos) << r.output;
  test::write_file(s.path("placement.json"), R"({"0": [0]})");
  r = test::run_command(check(m, "--placement " + s.path("placement.json")));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("placement.json: logical expert 1 has no physical slot"), std::string::npos) << r.output;

  // --check-weights: a NaN weight is found before any forward, by the local reference (every
  // expert) and, with a reference file, by the checked runtime.
  const std::string ref = s.path("ref.safetensors");
  r = test::run_command(test::epmoe() + " score --model " + m + " --ids 5,17,42,99,3,8,1 --out " + ref);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  test::RawSafetensors st = test::RawSafetensors::read(s.path("model.safetensors"));
  st.set_value("model.layers.0.mlp.experts.3.down_proj.weight", 0, std::numeric_limits<float>::infinity());
  st.write(s.path("model.safetensors"));
  for (const std::string& reference : {std::string(), " --reference " + ref}) {
    r = test::run_command(check(s.dir(), "--check-weights" + reference));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("--check-weights: tensor 'model.layers.0.mlp.experts.3.down_proj.weight'"),
              std::string::npos)
        << r.output;
  }

  // --compute bf16 on bf16 weights: activations rounded to bf16 where the CPU has the AVX512-BF16
  // dot product (the kernel path pinned to the best this CPU has), so against the f32 reference
  // the check fails there and passes elsewhere (f32 is used).
  const std::string mb = test::fixture("qwen3moe-tiny-mixed-bf16");
  const std::string refb = s.path("ref-bf16.safetensors");
  r = test::run_command(test::epmoe() + " score --model " + mb + " --ids 5,17,42,99,3,8,1 --out " + refb);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = test::run_command("EPMOE_KERNELS=auto " + check(mb, "--reference " + refb));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = test::run_command("EPMOE_KERNELS=auto " + check(mb, "--reference " + refb + " --compute bf16"));
  EXPECT_EQ(r.exit_code, cpu_features().avx512_bf16 ? 1 : 0) << r.output;

  // --device cuda: refused naming the flag by an epmoe built without CUDA (the GPU tests run check
  // on the device).
  if (!device_compiled(Device::Cuda)) {
    r = test::run_command(check(m, "--device cuda"));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("--device cuda"), std::string::npos) << r.output;
  }
}

// --comm-timeout: a rank that hangs (the test-only fault hook) is named by the other after the
// given seconds, and the group ends with an error.
TEST(CheckOptions, CommTimeoutEndsAHungCheck) {
  const int timeout_s = 2;
  auto r = test::run_command("EPMOE_TEST_FAULT=hang:1:3 " + test::mpirun(2) +
                             check(test::fixture("qwen3moe-tiny"), "--comm-timeout " + std::to_string(timeout_s)));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no answer from the group for " + std::to_string(timeout_s) + " s (--comm-timeout): rank 1 "
                          "does not answer"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace epmoe
