// The on-policy guarantee through the command: a sampled token's log-prob, as `generate --json
// --logprobs` reports it, is the same fp32 bits as `score --temperature` computes for the same
// sequence teacher-forced; the same request alone or among others, on 1, 2, 3 or 4 ranks with
// every backend, under any scheduler limit, KV pool, block size or prefix reuse, gives the same
// tokens and the same log-prob bits; a seed replays a rollout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "common/golden.h"
#include "common/run.h"
#include "io/safetensors.h"

namespace epmoe {
namespace {

using test::run_command;

std::string tmp(const std::string& name) {
  std::string t = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  for (auto& c : t)
    if (c == '/') c = '_';
  return ::testing::TempDir() + "/rollout_" + t + "_" + name;
}

std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') v.push_back(nlohmann::json::parse(line));
  return v;
}

// The printed log-probs read back as fp32 (they are printed to round-trip).
std::vector<float> floats(const nlohmann::json& a) {
  std::vector<float> v;
  for (auto& x : a) v.push_back(std::strtof(x.dump().c_str(), nullptr));
  return v;
}

const char* kPrompts = "5,17,42,99,3\n7,7,200,13\n1,2,3,4,5,6,7,8,9,10,11\n";

std::string prompts_file(const std::string& text) {
  const std::string f = tmp("prompts.txt");
  std::ofstream(f) << text;
  return f;
}

std::string generate(const std::string& prefix, const std::string& fixture, const std::string& prompts,
                     const std::string& extra) {
  auto r = run_command(prefix + test::epmoe() + " generate --model " + test::fixture(fixture) + " --prompts-file " +
                       prompts + " --max-new-tokens 10 --ignore-eos --temperature 0.9 --top-p 0.95 --n 2 --seed 3 " +
                       "--json --logprobs 2 " + extra);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

class Rollout : public ::testing::TestWithParam<std::string> {};

TEST_P(Rollout, GeneratedLogprobsAreTheTeacherForcedScoreBits) {
  const auto lines = json_lines(generate("", GetParam(), prompts_file(kPrompts), ""));
  ASSERT_EQ(lines.size(), 6u);  // 3 prompts x 2 samples, in input order
  for (size_t i = 0; i < lines.size(); i++) {
    const auto& j = lines[i];
    EXPECT_EQ(j["index"], i / 2);
    EXPECT_EQ(j["sample"], i % 2);
    EXPECT_EQ(j["seed"], 3 + i % 2);  // sample j uses seed + j
    std::vector<int32_t> seq = j["prompt_ids"].get<std::vector<int32_t>>();
    const auto out = j["output_ids"].get<std::vector<int32_t>>();
    const size_t P = seq.size();
    seq.insert(seq.end(), out.begin(), out.end());
    const auto lp = floats(j["output_logprobs"]);
    ASSERT_EQ(lp.size(), out.size());
    EXPECT_EQ(j["top_logprobs"].size(), out.size());
    const std::string file = tmp("score" + std::to_string(i) + ".safetensors");
    auto r = run_command(test::epmoe() + " score --model " + test::fixture(GetParam()) + " --temperature 0.9 --ids " +
                         test::join(seq) + " --out " + file);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto scored = to_f32(SafetensorsFile(file).get("token_logprobs"));
    ASSERT_EQ(scored.size(), seq.size());
    EXPECT_TRUE(std::isnan(scored[0]));
    for (size_t k = 0; k < out.size(); k++)
      EXPECT_EQ(std::memcmp(&scored[P + k], &lp[k], sizeof(float)), 0)
          << "line " << i << " token " << k << ": generate " << lp[k] << ", score " << scored[P + k];
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Rollout,
                         ::testing::Values("qwen3moe-tiny", "qwen3moe-tiny-mixed-bf16", "qwen3moe-tiny-v5",
                                           "qwen2moe-tiny", "glm4moe-tiny", "mixtral-tiny"));

TEST(Rollout, SameRequestAloneAmongOthersOnEveryLayoutAndBackend) {
  const std::string fx = "qwen3moe-tiny-mixed-bf16";
  const auto all = json_lines(generate("", fx, prompts_file(kPrompts), ""));
  ASSERT_EQ(all.size(), 6u);
  // The third prompt alone (index 0 there): the same samples, bit for bit.
  const auto alone = json_lines(generate("", fx, prompts_file("1,2,3,4,5,6,7,8,9,10,11\n"), ""));
  ASSERT_EQ(alone.size(), 2u);
  for (size_t s = 0; s < 2; s++) {
    EXPECT_EQ(alone[s]["output_ids"], all[4 + s]["output_ids"]);
    EXPECT_EQ(alone[s]["output_logprobs"], all[4 + s]["output_logprobs"]);
    EXPECT_EQ(alone[s]["top_logprobs"], all[4 + s]["top_logprobs"]);
  }
  // Several ranks, every backend: the same lines.
  const std::string prompts = prompts_file(kPrompts);
  for (int ranks : {2, 3, 4})
    for (const std::string backend : {"none", "alltoall", "lowlatency", "onesided", "fused"}) {
      const auto got = json_lines(generate(test::mpirun(ranks), fx, prompts,
                                           "--moe-a2a-backend " + backend + " --max-dispatch-tokens-per-rank 3"));
      ASSERT_EQ(got.size(), all.size()) << ranks << " ranks " << backend;
      for (size_t i = 0; i < all.size(); i++) EXPECT_EQ(got[i], all[i]) << ranks << " ranks " << backend << " line " << i;
    }
}

// The scheduler (engine/lockstep.h): 32 requests of lengths 1..41, with every token budget and
// in-flight limit, on 1 and 2 ranks, give the lines of the unlimited run; one request alone gives
// its line among the 31 others. Greedy decoding (the device-argmax path) likewise.
TEST(Rollout, SchedulerLimitsChangeNoBit) {
  const std::string fx = "qwen3moe-tiny-mixed-bf16";
  std::string text;
  uint64_t x = 5;
  for (int i = 0; i < 32; i++) {
    for (int k = 0; k < 1 + (i * 7) % 41; k++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      text += (k ? "," : "") + std::to_string((x >> 33) % 320);
    }
    text += "\n";
  }
  const std::string prompts = prompts_file(text);
  // Every line's every field but cached_tokens: which prompt finds which cached rows depends on
  // the order requests run in (a count of reused work, not a bit of the output).
  auto run = [&](const std::string& prefix, const std::string& file, const std::string& flags) {
    auto r = run_command(prefix + test::epmoe() + " generate --model " + test::fixture(fx) + " --prompts-file " + file +
                         " --max-new-tokens 8 --ignore-eos " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return std::regex_replace(r.output, std::regex(R"("cached_tokens":[0-9]+,)"), "");
  };
  const std::string sampled = "--temperature 0.9 --min-p 0.02 --seed 11 --json --logprobs ";
  const std::string want = run("", prompts, sampled);
  ASSERT_EQ(json_lines(want).size(), 32u);
  for (const std::string limits : {"--max-batch-tokens 7", "--max-batch-tokens 64", "--max-batch-tokens 1",
                                   "--max-running-requests 3 --max-batch-tokens 5", "--max-running-requests 1",
                                   // a pool of 96 positions for a workload of ~1000: requests wait for blocks
                                   "--kv-cache-tokens 96 --kv-block-size 4", "--kv-block-size 1 --no-prefix-cache"})
    EXPECT_EQ(run("", prompts, sampled + limits), want) << limits;
  EXPECT_EQ(run(test::mpirun(2), prompts, sampled + "--max-batch-tokens 7 --moe-a2a-backend alltoall"), want);
  // Request 20 alone (index 0 there) is line 20 among the others.
  std::istringstream in(text);
  std::string line;
  for (int i = 0; i <= 20; i++) std::getline(in, line);
  auto alone = json_lines(run("", prompts_file(line + "\n"), sampled));
  ASSERT_EQ(alone.size(), 1u);
  const auto among = json_lines(want)[20];
  EXPECT_EQ(alone[0]["output_ids"], among["output_ids"]);
  EXPECT_EQ(alone[0]["output_logprobs"], among["output_logprobs"]);
  // Greedy, picked on the device path.
  const std::string greedy = run("", prompts, "");
  EXPECT_EQ(run("", prompts, "--max-batch-tokens 7 --max-running-requests 4"), greedy);
}

// Prompts that share prefixes, one at a time so that each finds the blocks of the ones before:
// the lines are those of computing every prompt in full.
TEST(Rollout, PrefixReuseChangesNoBit) {
  const std::string fx = "qwen3moe-tiny";
  std::string head = "9,8,7,6,5,4,3,2,1,11,12,13,14,15,16,17,18,19,20,21";
  const std::string p = prompts_file(head + "\n" + head + ",30,31\n" + head + "\n" + "9,8,7,6,5,4,3,2,1,11,99\n");
  auto run = [&](const std::string& flags) {
    auto r = run_command(test::epmoe() + " generate --model " + test::fixture(fx) + " --prompts-file " + p +
                         " --max-new-tokens 6 --ignore-eos --temperature 0.7 --seed 5 --n 2 --json --logprobs 1 " +
                         "--max-running-requests 2 --kv-block-size 4 " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  auto reused = json_lines(run("")), full = json_lines(run("--no-prefix-cache"));
  ASSERT_EQ(reused.size(), 8u);
  ASSERT_EQ(full.size(), 8u);
  // Blocks of 4, matched token by token: prompt 1 finds the 5 blocks of prompt 0; prompt 2 (=
  // prompt 0) 19 of its tokens (one at least is computed: 4 blocks and 3 rows of the 5th); prompt
  // 3 its first 10 (2 blocks and 2 rows).
  const int cached[] = {0, 20, 19, 10};
  for (size_t i = 0; i < 8; i++) {
    EXPECT_EQ(reused[i]["cached_tokens"], cached[i / 2]) << "line " << i;
    EXPECT_EQ(full[i]["cached_tokens"], 0);
    reused[i].erase("cached_tokens");
    full[i].erase("cached_tokens");
    EXPECT_EQ(reused[i], full[i]) << "line " << i;
  }
}

TEST(Rollout, ARequestNoPoolCanHoldIsRefusedOnEveryRank) {
  auto r = run_command(test::mpirun(2) + test::epmoe() + " generate --model " + test::fixture("qwen3moe-tiny") +
                       " --prompts-file " + prompts_file(kPrompts) + " --max-new-tokens 30 --kv-cache-tokens 32");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("raise --kv-cache-tokens"), std::string::npos) << r.output;
}

TEST(Rollout, ASeedReplaysAndAFreshOneIsReported) {
  const std::string fx = "qwen3moe-tiny";
  const std::string p = prompts_file("5,17,42\n");
  auto run = [&](const std::string& seed) {
    auto r = run_command(test::epmoe() + " generate --model " + test::fixture(fx) + " --prompts-file " + p +
                         " --max-new-tokens 12 --ignore-eos --temperature 1.0 --json --logprobs " + seed);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return json_lines(r.output);
  };
  const auto a = run(""), b = run("");
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_NE(a[0]["seed"], b[0]["seed"]);  // fresh seeds (64-bit: equal only by a bug)
  const auto replay = run("--seed " + a[0]["seed"].dump());
  EXPECT_EQ(replay[0], a[0]);
  EXPECT_NE(a[0]["output_ids"], b[0]["output_ids"]);
}

TEST(Rollout, SamplingFlagsAreCheckedBeforeAnyWork) {
  const std::string m = " generate --model " + test::fixture("qwen3moe-tiny") + " --prompt-ids 1,2 ";
  for (const std::string flags : {"--temperature -1", "--top-p 0", "--top-p 1.5", "--min-p 2", "--top-k -3",
                                  "--n 2", "--n 0 --temperature 1"}) {
    auto r = run_command(test::epmoe() + m + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.output;
  }
}

}  // namespace
}  // namespace epmoe

namespace epmoe {
namespace {

// `generate --json` writes every log-prob as the shortest decimal that reads back as its fp32 (at
// most 9 significant digits): nlohmann's own printer gave 17 digits for ~0.15% of them
// (-4.7081480000000004), so ~3000 printed numbers here would hold some.
TEST(Rollout, JsonLogprobsAreTheShortestDecimalsOfTheirFloats) {
  std::string text;
  for (int i = 0; i < 12; i++) text += std::to_string(3 + i) + "," + std::to_string(40 + 7 * i) + ",9\n";
  const auto r = run_command(test::epmoe() + " generate --model " + test::fixture("qwen3moe-tiny") +
                             " --prompts-file " + prompts_file(text) +
                             " --max-new-tokens 48 --ignore-eos --temperature 0.9 --seed 3 --json --logprobs 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::regex number(R"(-?[0-9]+\.[0-9]+(e-?[0-9]+)?)");
  int checked = 0, longer = 0;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), number); it != std::sregex_iterator(); ++it) {
    const std::string t = it->str();
    const float v = std::strtof(t.c_str(), nullptr);
    // the shortest: no decimal with fewer significant digits reads back as v
    char buf[32];
    int digits = 1;
    for (; digits <= 9; digits++) {
      std::snprintf(buf, sizeof buf, "%.*g", digits, double(v));
      if (std::strtof(buf, nullptr) == v) break;
    }
    std::string sig;
    for (char c : t.substr(0, t.find('e')))
      if (c >= '0' && c <= '9') sig += c;
    sig.erase(0, sig.find_first_not_of('0'));
    sig.erase(sig.find_last_not_of('0') + 1);
    longer += int(sig.size()) > digits;
    checked++;
  }
  EXPECT_GT(checked, 2000);
  EXPECT_EQ(longer, 0) << "of " << checked << " printed log-probs";
}

}  // namespace
}  // namespace epmoe
