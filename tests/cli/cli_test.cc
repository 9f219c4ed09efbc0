// The `epmoe` command as users run it: score and generate against the goldens, info, and the
// exit codes of bad input.
#include <gtest/gtest.h>

#include "common/golden.h"
#include "common/run.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "tensor/dtype.h"

#include <map>
#include "kernels/cpu_features.h"

namespace epmoe {
namespace {

using test::Golden;
using test::run_command;

std::string tmp_file(const std::string& name) {
  std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  for (auto& c : test)
    if (c == '/') c = '_';  // parameterised tests are named Suite/Name/param
  return ::testing::TempDir() + "/" + test + "_" + name;
}

class CliGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(CliGolden, ScoreReproducesGoldenLogits) {
  Golden g(GetParam());
  for (int s = 0; s < g.sequences(); s++) {
    const std::string p = "seq" + std::to_string(s) + ".";
    const std::string out = tmp_file(std::to_string(s) + ".safetensors");
    auto r = run_command(test::epmoe() + " score --model " + test::fixture(GetParam()) + " --ids " +
                         test::join(g.ids(p + "all_ids")) + " --out " + out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    SafetensorsFile f(out);
    TensorView v = f.get("logits");
    auto want = g.f32(p + "logits");
    ASSERT_EQ(size_t(v.numel()), want.size());
    const float diff = test::max_abs_diff(to_f32(v), want);
    std::printf("[cli] %s %s score max |diff| = %.3g\n", GetParam().c_str(), p.c_str(), double(diff));
    EXPECT_LE(diff, 1e-4f);
  }
}

TEST_P(CliGolden, GenerateReproducesGoldenIds) {
  Golden g(GetParam());
  for (int s = 0; s < g.sequences(); s++) {
    const std::string p = "seq" + std::to_string(s) + ".";
    auto prompt = g.ids(p + "prompt_ids"), all = g.ids(p + "all_ids");
    auto margin = g.f32(p + "top2_margin");
    auto r = run_command(test::epmoe() + " generate --ignore-eos --max-new-tokens 12 --model " +
                         test::fixture(GetParam()) + " --prompt-ids " + test::join(prompt));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::vector<int32_t> want(all.begin() + long(prompt.size()), all.end());
    // Compare up to the first near-tie of the golden (later tokens depend on a coin flip).
    size_t n = 0;
    while (n < want.size() && margin[prompt.size() + n - 1] > 1e-3f) n++;
    ASSERT_GT(n, 0u);
    std::string got = r.output.substr(0, r.output.find('\n'));
    std::string expect = test::join(std::vector<int32_t>(want.begin(), want.begin() + long(n)));
    EXPECT_EQ(got.substr(0, expect.size()), expect) << "full output: " << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CliGolden, ::testing::ValuesIn(test::all_model_fixtures()), test::FixtureName());

TEST(Cli, InfoDescribesTheModel) {
  auto r = run_command(test::epmoe() + " info --model " + test::fixture("qwen3moe-tiny-mixed-bf16"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("qwen3_moe"), std::string::npos);
  EXPECT_NE(r.output.find("sparse layers  1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dense layers   0 2 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("BF16"), std::string::npos);
  EXPECT_NE(r.output.find("16 routed, top-4"), std::string::npos) << r.output;
}

// --lm-head int8 reaches the model from the command line: score's logits move by the head's
// quantization (well under a tenth here; tests/model/int8_head_test.cc holds the bound), and a
// bad value exits 2 naming the option.
TEST(Cli, LmHeadInt8IsTakenAndBadValuesAreRefused) {
  const std::string m = " --model " + test::fixture("qwen3moe-tiny");
  Golden g("qwen3moe-tiny");
  const std::string ids = test::join(g.ids("seq0.all_ids"));
  const std::string a = tmp_file("head_exact.safetensors"), b = tmp_file("head_int8.safetensors");
  auto r = run_command(test::epmoe() + " score" + m + " --ids " + ids + " --out " + a);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command(test::epmoe() + " score" + m + " --lm-head int8 --ids " + ids + " --out " + b);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const float diff = test::max_abs_diff(to_f32(SafetensorsFile(a).get("logits")), to_f32(SafetensorsFile(b).get("logits")));
  EXPECT_GT(diff, 0.0f);
  EXPECT_LT(diff, 0.1f);
  r = run_command(test::epmoe() + " score" + m + " --lm-head int4 --ids 1 --out " + tmp_file("bad"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--lm-head"), std::string::npos) << r.output;
}

TEST(Cli, BadInputExitsWithTwoAndNamesTheProblem) {
  const std::string m = " --model " + test::fixture("qwen3moe-tiny");
  auto r = run_command(test::epmoe() + " score" + m + " --ids 1,2,999 --out " + tmp_file("x"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("token id 999"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("outside the vocabulary"), std::string::npos) << r.output;
  r = run_command(test::epmoe() + " generate" + m + " --prompt-ids ''");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run_command(test::epmoe() + " score --model /nonexistent --ids 1 --out " + tmp_file("y"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/config.json"), std::string::npos) << r.output;
  r = run_command(test::epmoe() + " score" + m + " --ids 1 --out " + tmp_file("z") + " --moe-a2a-backend mori");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown backend"), std::string::npos) << r.output;
  r = run_command(test::epmoe() + " frobnicate");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

// --compute reaches the CPU model through the engine (the model owns its mode): bf16 compute gives
// other logits than f32 on the bf16 fixture, within the bf16 tolerance of the goldens, and the
// same bits on 1 and 2 ranks; f32 stays at the goldens' 1e-4.
TEST(Cli, ComputeModeReachesTheModel) {
  if (!cpu_features().avx512_bf16) GTEST_SKIP() << "no AVX512-BF16 on this CPU: --compute bf16 runs as f32";
  const std::string fx = "qwen3moe-tiny-mixed-bf16";
  Golden g(fx);
  const std::string ids = test::join(g.ids("seq0.all_ids"));
  auto score = [&](const std::string& prefix, const std::string& compute, const std::string& name) {
    const std::string out = tmp_file(name);
    auto r = run_command(prefix + test::epmoe() + " score --model " + test::fixture(fx) + " --ids " + ids +
                         " --compute " + compute + " --out " + out);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return to_f32(SafetensorsFile(out).get("logits"));
  };
  const auto want = g.f32("seq0.logits");
  const auto f32 = score("", "f32", "f32.safetensors");
  const auto bf16 = score("", "bf16", "bf16.safetensors");
  const auto bf16_2 = score(test::mpirun(2), "bf16", "bf16_2ranks.safetensors");
  EXPECT_LE(test::max_abs_diff(f32, want), 1e-4f);
  const float d = test::max_abs_diff(bf16, want);
  EXPECT_GT(d, 1e-4f) << "--compute bf16 gave the f32 logits: the mode did not reach the model";
  EXPECT_LE(d, 5e-2f);
  EXPECT_EQ(bf16, bf16_2);
}

// The test suite is built without CUDA (EPMOE_HAVE_CUDA is private to the library): every command
// that takes --device must refuse cuda as bad input, before any work, naming how to get it.
TEST(Cli, DeviceCudaWithoutCudaBuildExitsWithTwo) {
  const std::string model = " --model " + test::fixture("qwen3moe-tiny");
  for (const std::string cmd : {"score --ids 1,2 --out /dev/null", "generate --prompt-ids 1,2", "check"}) {
    auto r = run_command(test::epmoe() + " " + cmd + model + " --device cuda");
    EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.output;
    EXPECT_NE(r.output.find("built without CUDA"), std::string::npos) << cmd << ": " << r.output;
  }
}

}  // namespace
}  // namespace epmoe

namespace epmoe {
namespace {

// `epmoe synth` writes what the hub writes: from each new family's fixture config, the same
// tensor names, shapes and dtypes as the fixture (fp8 codes with F32 or BF16 scale grids,
// latent-attention projections, correction biases, shared experts), and the result runs.
class SynthLikeFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(SynthLikeFixture, SameTensorsAsTheHubLayoutAndItRuns) {
  const std::string out = ::testing::TempDir() + "/synth_" + GetParam();
  auto r = test::run_command(test::epmoe() + " synth --like " + test::fixture(GetParam()) + "/config.json --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Checkpoint want(test::fixture(GetParam())), got(out);
  std::map<std::string, std::string> w, g;
  auto describe = [](const Checkpoint& c, std::map<std::string, std::string>& m) {
    for (auto& n : c.names()) {
      TensorView v = c.get(n);
      m[n] = std::string(dtype_name(v.dtype)) + " " + v.shape_str();
    }
  };
  describe(want, w);
  describe(got, g);
  EXPECT_EQ(g, w);
  auto run = test::run_command(test::epmoe() + " generate --model " + out + " --prompt-ids 1,2,3 --max-new-tokens 3");
  EXPECT_EQ(run.exit_code, 0) << run.output;
}

INSTANTIATE_TEST_SUITE_P(Families, SynthLikeFixture,
                         ::testing::Values("deepseek-v2-lite-tiny", "deepseek-v2-tiny", "deepseek-v3-tiny",
                                           "glm4moe-lite-tiny", "qwen3moe-fp8-tiny", "deepseek-v3-fp8-tiny"),
                         test::FixtureName());

}  // namespace
}  // namespace epmoe

namespace epmoe {
namespace {

// The fp8 tensor-core path exists on GPUs only: asked for on the CPU it is refused (exit 2)
// with the reason, before any weight is read; the default is the exact dequantizing path.
// The KV cache's dtype and the memory fraction size the GPU's pool; on the CPU K and V stay fp32:
// bf16 and a fraction are refused (exit 2) naming the flag, auto and fp32 are the same run.
TEST(Cli, KvCacheDtypeAndMemFractionOnTheCpu) {
  const std::string m = " --model " + test::fixture("qwen3moe-tiny-mixed-bf16") + " --prompt-ids 1,2,3 --max-new-tokens 3";
  auto bf16 = test::run_command(test::epmoe() + " generate --kv-cache-dtype bf16" + m);
  EXPECT_EQ(bf16.exit_code, 2) << bf16.output;
  EXPECT_NE(bf16.output.find("--kv-cache-dtype bf16: a bf16 KV cache exists on --device cuda only"), std::string::npos)
      << bf16.output;
  auto frac = test::run_command(test::epmoe() + " generate --mem-fraction 0.5" + m);
  EXPECT_EQ(frac.exit_code, 2) << frac.output;
  EXPECT_NE(frac.output.find("--mem-fraction sizes the GPU's KV cache"), std::string::npos) << frac.output;
  auto bad = test::run_command(test::epmoe() + " generate --kv-cache-dtype fp8" + m);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  auto fp32 = test::run_command(test::epmoe() + " generate --kv-cache-dtype fp32" + m);
  auto plain = test::run_command(test::epmoe() + " generate" + m);
  EXPECT_EQ(fp32.exit_code, 0) << fp32.output;
  EXPECT_EQ(fp32.output, plain.output);
}

TEST(Cli, Fp8TensorCoreComputeIsRefusedOnTheCpu) {
  const std::string m = " --model " + test::fixture("qwen3moe-fp8-tiny") + " --prompt-ids 1,2,3 --max-new-tokens 2";
  auto refused = test::run_command(test::epmoe() + " generate --fp8-compute tensor-core" + m);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--fp8-compute tensor-core: the fp8 tensor-core path exists on --device cuda only"),
            std::string::npos)
      << refused.output;
  auto exact = test::run_command(test::epmoe() + " generate --fp8-compute dequant" + m);
  auto plain = test::run_command(test::epmoe() + " generate" + m);
  EXPECT_EQ(exact.exit_code, 0) << exact.output;
  EXPECT_EQ(exact.output, plain.output);
}

}  // namespace
}  // namespace epmoe

namespace epmoe {
namespace {

// `epmoe synth` draws each 4M-value chunk of a tensor from its own generator (seed, tensor name,
// chunk), so the threads that write it change no byte; and --dtype fp8 is the bf16 model of the
// same seed quantized (each code the nearest e4m3 of the bf16 weight over its block scale).
std::map<std::string, std::string> tensor_bytes(const std::string& dir) {
  Checkpoint c(dir);
  std::map<std::string, std::string> m;
  for (auto& n : c.names()) {
    TensorView v = c.get(n);
    m[n] = std::string(static_cast<const char*>(v.data), v.nbytes());
  }
  return m;
}

TEST(Synth, TheBytesDoNotDependOnTheThreadsAndFp8QuantizesTheBf16ModelOfTheSameSeed) {
  const std::string cfg = test::fixture("qwen3moe-fp8-tiny") + "/config.json";
  const std::string base = ::testing::TempDir() + "/synth_threads_";
  auto synth = [&](const std::string& args, const std::string& out) {
    auto r = test::run_command(test::epmoe() + " synth --like " + cfg + " --shard-gb 0.0005 --out " + out + " " + args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  };
  synth("--dtype bf16 --seed 5 --threads 1", base + "1");
  synth("--dtype bf16 --seed 5 --threads 3", base + "3");
  synth("--dtype bf16 --seed 6 --threads 2", base + "other");
  synth("--dtype fp8 --seed 5 --threads 2", base + "fp8");
  const auto one = tensor_bytes(base + "1"), three = tensor_bytes(base + "3"), other = tensor_bytes(base + "other");
  ASSERT_GT(one.size(), 10u);
  EXPECT_EQ(one, three);
  size_t differ = 0;
  for (auto& [n, b] : one) differ += other.at(n) != b;
  EXPECT_GT(differ, one.size() / 2) << "another seed must give other weights";
  Checkpoint bf(base + "1"), f8(base + "fp8");
  size_t fp8_tensors = 0;
  for (auto& n : f8.names()) {
    TensorView q = f8.get(n);
    if (q.dtype != DType::F8_E4M3) continue;
    fp8_tensors++;
    TensorView w = bf.get(n);
    TensorView s = f8.get(n.substr(0, n.size() - std::string("weight").size()) + "weight_scale_inv");
    ASSERT_EQ(w.numel(), q.numel()) << n;
    const float scale = s.at(0);
    const auto* codes = static_cast<const uint8_t*>(q.data);
    for (int64_t i = 0; i < q.numel(); i++)
      ASSERT_EQ(codes[i], f32_to_fp8e4m3(w.at(i) / scale)) << n << " element " << i;
  }
  EXPECT_GT(fp8_tensors, 5u);
}

}  // namespace
}  // namespace epmoe
