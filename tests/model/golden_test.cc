// The model against transformers' goldens (tests/data/*/golden.safetensors), for every family:
// logits at every position, greedy ids where the golden top-2 margin is not tiny, the MoE / MLP
// block alone, and incremental decoding against full recomputation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/cpu_model.h"
#include "common/golden.h"
#include "comm/mpi_group.h"
#include "ep/backend.h"
#include "io/checkpoint.h"
#include "engine/lockstep.h"
#include "model/model.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"

namespace epmoe {
namespace {

using test::Golden;

using Loaded = test::CpuModel;

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, LogitsMatchTransformers) {
  Loaded m(GetParam());
  Golden g(GetParam());
  ASSERT_GE(g.sequences(), 1);
  for (int s = 0; s < g.sequences(); s++) {
    const std::string p = "seq" + std::to_string(s) + ".";
    auto ids = g.ids(p + "all_ids");
    Sequence seq = m.model.new_sequence(0);
    auto logits = m.model.forward({&seq}, {ids}, *m.backend, true);
    const float diff = test::max_abs_diff(logits[0], g.f32(p + "logits"));
    std::printf("[golden] %s %s max |logit diff| = %.3g\n", GetParam().c_str(), p.c_str(), double(diff));
    EXPECT_LE(diff, 1e-4f) << GetParam() << " " << p;
  }
}

TEST_P(GoldenTest, GreedyIdsMatchWhereMarginIsClear) {
  Loaded m(GetParam());
  Golden g(GetParam());
  for (int s = 0; s < g.sequences(); s++) {
    const std::string p = "seq" + std::to_string(s) + ".";
    auto prompt = g.ids(p + "prompt_ids"), all = g.ids(p + "all_ids");
    auto margin = g.f32(p + "top2_margin");
    GenerateParams gp;
    gp.max_new_tokens = int(all.size() - prompt.size());
    auto out = generate_greedy(m.model, *m.backend, MpiGroup::world(), {GenerateRequest{0, prompt, 0, 1, {}}}, gp)[0];
    ASSERT_EQ(out.size(), all.size() - prompt.size());
    int compared = 0;
    for (size_t j = 0; j < out.size(); j++) {
      const size_t pos = prompt.size() + j;  // token at pos is chosen from the logits at pos - 1
      if (margin[pos - 1] <= 1e-3f) break;   // a near-tie: later tokens are not comparable
      EXPECT_EQ(out[j], all[pos]) << GetParam() << " " << p << " new token " << j;
      compared++;
    }
    EXPECT_GT(compared, 0);
  }
}

TEST_P(GoldenTest, MlpBlockAloneMatches) {
  Loaded m(GetParam());
  Golden g(GetParam());
  int checked = 0;
  for (int l = 0; l < m.cfg.num_layers; l++) {
    const std::string k = "seq0.model.layers." + std::to_string(l) + ".mlp.";
    if (!g.has(k + "in")) continue;
    auto in = g.f32(k + "in"), want = g.f32(k + "out");
    const int64_t T = int64_t(in.size()) / m.cfg.hidden_size;
    std::vector<uint64_t> gids(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; t++) gids[size_t(t)] = uint64_t(t);
    std::vector<float> got(in.size());
    m.model.mlp_block(l, in.data(), T, gids.data(), *m.backend, got.data());
    const float diff = test::max_abs_diff(got, want);
    std::printf("[golden] %s layer %d (%s) max |out diff| = %.3g\n", GetParam().c_str(), l,
                m.cfg.sparse_layer[size_t(l)] ? "moe" : "dense", double(diff));
    EXPECT_LE(diff, 1e-5f) << GetParam() << " layer " << l;
    checked++;
  }
  EXPECT_EQ(checked, m.cfg.num_layers);
}

TEST_P(GoldenTest, IncrementalDecodingEqualsRecompute) {
  Loaded m(GetParam());
  Golden g(GetParam());
  auto ids = g.ids("seq1.all_ids");
  Sequence full = m.model.new_sequence(0);
  auto ref = m.model.forward({&full}, {ids}, *m.backend, true)[0];
  // Feed a prefix, then one token at a time.
  Sequence inc = m.model.new_sequence(0);
  const size_t prefix = ids.size() / 2;
  std::vector<float> got = m.model.forward({&inc}, {{ids.begin(), ids.begin() + long(prefix)}}, *m.backend, true)[0];
  for (size_t i = prefix; i < ids.size(); i++) {
    auto l = m.model.forward({&inc}, {{ids[i]}}, *m.backend, true)[0];
    got.insert(got.end(), l.begin(), l.end());
  }
  ASSERT_EQ(got.size(), ref.size());
  EXPECT_LE(test::max_abs_diff(got, ref), 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::ValuesIn(test::all_model_fixtures()),
                         test::FixtureName());

}  // namespace
}  // namespace epmoe

namespace epmoe {
namespace {

// --compute bf16 (activations rounded to bf16 for the matmuls with bf16 weights) against the fp32
// goldens, on the fixture with bf16 weights. The error is stated here and in the README.
TEST(GoldenBf16Compute, MixedBf16FixtureWithinStatedTolerance) {
  if (!cpu_features().avx512_bf16) GTEST_SKIP() << "CPU without AVX512-BF16: --compute bf16 falls back to f32";
  Loaded m("qwen3moe-tiny-mixed-bf16", {}, LmHeadForm::Checkpoint, ComputeMode::BF16);
  Golden g("qwen3moe-tiny-mixed-bf16");
  float worst = 0;
  for (int s = 0; s < g.sequences(); s++) {
    const std::string p = "seq" + std::to_string(s) + ".";
    Sequence seq = m.model.new_sequence(0);
    auto logits = m.model.forward({&seq}, {g.ids(p + "all_ids")}, *m.backend, true);
    worst = std::max(worst, test::max_abs_diff(logits[0], g.f32(p + "logits")));
  }
  std::printf("[golden] qwen3moe-tiny-mixed-bf16 --compute bf16 max |logit diff| = %.3g\n", double(worst));
  EXPECT_GT(worst, 0.0f);    // the mode really rounds activations
  EXPECT_LE(worst, 5e-2f);   // the stated tolerance of --compute bf16 (measured: 0.0345)
}

}  // namespace
}  // namespace epmoe

namespace epmoe {
namespace {

// --compute bf16 on the FP8 fixtures: codes widened to bf16, bf16 dot products per 128-block,
// block scales in fp32 (kernels/matmul.h), against the fp32 goldens of the dequantized weights.
// Per position the logits move by 0.03-0.15 (the fp32 path: 5e-5); at the odd position a router
// choice that was a near tie flips and that token's logits move by several units (measured: one
// position of deepseek-v3-fp8-tiny, 5.3), so the check is on the bulk of the positions and on the
// greedy choices, not on the worst one.
TEST(GoldenBf16Compute, Fp8FixturesWithinStatedTolerance) {
  if (!cpu_features().avx512_bf16) GTEST_SKIP() << "CPU without AVX512-BF16: --compute bf16 falls back to f32";
  for (const std::string& name : test::fp8_fixtures()) {
    std::vector<float> per_pos;
    int agree = 0;
    {
      Loaded m(name, {}, LmHeadForm::Checkpoint, ComputeMode::BF16);
      Golden g(name);
      const int64_t V = m.cfg.vocab_size;
      for (int s = 0; s < g.sequences(); s++) {
        const std::string p = "seq" + std::to_string(s) + ".";
        Sequence seq = m.model.new_sequence(0);
        auto got = m.model.forward({&seq}, {g.ids(p + "all_ids")}, *m.backend, true)[0];
        auto want = g.f32(p + "logits");
        ASSERT_EQ(got.size(), want.size());
        for (size_t r = 0; r * size_t(V) < got.size(); r++) {
          float d = 0;
          for (int64_t v = 0; v < V; v++) d = std::max(d, std::fabs(got[r * size_t(V) + size_t(v)] - want[r * size_t(V) + size_t(v)]));
          per_pos.push_back(d);
          agree += argmax(&got[r * size_t(V)], V) == argmax(&want[r * size_t(V)], V);
        }
      }
    }
    std::vector<float> sorted = per_pos;
    std::sort(sorted.begin(), sorted.end());
    const float p90 = sorted[sorted.size() * 9 / 10], worst = sorted.back();
    const double agreement = double(agree) / double(per_pos.size());
    std::printf("[golden] %s --compute bf16: |dlogit| per position: 90th percentile %.3g, worst %.3g; argmax agrees at "
                "%.0f%% of %zu positions\n",
                name.c_str(), double(p90), double(worst), 100 * agreement, per_pos.size());
    EXPECT_GT(sorted.front(), 1e-4f) << name;  // the mode really rounds
    EXPECT_LE(p90, 0.25f) << name;
    EXPECT_GE(agreement, 0.85) << name;
  }
}

}  // namespace
}  // namespace epmoe
