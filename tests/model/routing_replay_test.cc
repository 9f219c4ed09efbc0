// Routing replay (R3) on the CPU model (ForwardOptions::capture / replay): the routing captured for a
// sequence does not depend on how its tokens were batched (prefill at once == prefill then one token
// at a time); replaying it gives the same logits bit for bit; replaying another routing changes
// them (the replay is used, not ignored); a replay of the wrong shape or with an id that is not an
// expert is refused with an InputError. Every routing family: softmax top-k (Qwen3, Qwen2 with a
// shared expert, Mixtral), sigmoid group-limited with a correction bias (DeepSeek-V3), latent
// attention's models (DeepSeek-V2-Lite).
#include <gtest/gtest.h>

#include <cstring>

#include "common/golden.h"
#include "ep/backend.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "util/error.h"
#include "common/vectors.h"

namespace epmoe {
namespace {

class RoutingReplay : public ::testing::TestWithParam<const char*> {};

TEST_P(RoutingReplay, CaptureReplaysToTheSameBits) {
  const std::string name = GetParam();
  ModelConfig cfg = load_model_config(test::fixture(name));
  Checkpoint ck(test::fixture(name));
  Placement pl = Placement::make_default(cfg.routing.num_experts, 1, 0);
  Model m(cfg, ck, pl, 0, ComputeMode::F32);
  auto be = make_local_backend(Device::Cpu, pl);
  std::vector<int32_t> ids;
  for (int i = 0; i < 11; i++) ids.push_back(int32_t((i * 37 + 5) % cfg.vocab_size));
  const int M = cfg.num_sparse_layers(), K = cfg.routing.top_k;
  ASSERT_GT(M, 0);

  // The whole prompt in one step, routing captured.
  Sequence a = m.new_sequence(3);
  StepRouting cap;
  ForwardOptions with_capture;
  with_capture.capture = &cap;
  const auto full = m.forward({&a}, {ids}, *be, true, with_capture)[0];
  ASSERT_EQ(cap.moe_layers, M);
  ASSERT_EQ(cap.K, K);
  ASSERT_EQ(cap.tokens(), int64_t(ids.size()));
  for (int32_t e : cap.ids) ASSERT_TRUE(e >= 0 && e < cfg.routing.num_experts) << name;

  // Prefill of 6 tokens, then one token a step: the same routing, token by token (ids and weight bits).
  Sequence b = m.new_sequence(3);
  StepRouting inc, part;
  ForwardOptions part_capture;
  part_capture.capture = &part;
  m.forward({&b}, {{ids.begin(), ids.begin() + 6}}, *be, false, part_capture);
  inc = part;
  for (size_t i = 6; i < ids.size(); i++) {
    m.forward({&b}, {{ids[i]}}, *be, false, part_capture);
    inc.ids.insert(inc.ids.end(), part.ids.begin(), part.ids.end());
    inc.weights.insert(inc.weights.end(), part.weights.begin(), part.weights.end());
  }
  EXPECT_EQ(inc.ids, cap.ids) << name << ": routing captured token by token == in one step";
  EXPECT_TRUE(test::same_bits(inc.weights, cap.weights)) << name << ": routing weights token by token == in one step";

  // Replayed: the router's choice given back, the same logits.
  Sequence c = m.new_sequence(3);
  ForwardOptions with_replay;
  with_replay.replay = &cap;
  EXPECT_TRUE(test::same_bits(m.forward({&c}, {ids}, *be, true, with_replay)[0], full))
      << name << ": re-score with the replayed routing == the captured run (bits)";

  // Another routing replayed: token 4's first choice in the first MoE layer moved to another
  // expert. Its logits change; the tokens before it do not (causal attention).
  StepRouting other = cap;
  const size_t at = (size_t(4) * size_t(M)) * size_t(K);
  int32_t& e = other.ids[at];
  int32_t moved = (e + 1) % cfg.routing.num_experts;
  for (int k = 1; k < K; k++)  // (not one of the token's other choices)
    if (other.ids[at + size_t(k)] == moved) moved = (moved + 1) % cfg.routing.num_experts, k = 0;
  e = moved;
  Sequence d = m.new_sequence(3);
  with_replay.replay = &other;
  const auto changed = m.forward({&d}, {ids}, *be, true, with_replay)[0];
  const size_t V = size_t(cfg.vocab_size);
  EXPECT_EQ(std::memcmp(changed.data(), full.data(), 4 * V * sizeof(float)), 0) << name << ": tokens before 4 unchanged";
  EXPECT_NE(std::memcmp(changed.data() + 4 * V, full.data() + 4 * V, V * sizeof(float)), 0)
      << name << ": another expert replayed for token 4 changes its logits";

  // Refused: a replay for another token count, and an id that is not an expert.
  Sequence f = m.new_sequence(3);
  StepRouting short_one = cap;
  short_one.ids.resize(short_one.ids.size() - size_t(M * K));
  short_one.weights.resize(short_one.ids.size());
  with_replay.replay = &short_one;
  EXPECT_THROW(m.forward({&f}, {ids}, *be, true, with_replay), InputError);
  Sequence g = m.new_sequence(3);
  StepRouting bad = cap;
  bad.ids[0] = cfg.routing.num_experts;
  with_replay.replay = &bad;
  EXPECT_THROW(m.forward({&g}, {ids}, *be, true, with_replay), InputError);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RoutingReplay,
                         ::testing::Values("qwen3moe-tiny", "qwen2moe-tiny", "mixtral-tiny", "deepseek-v3-tiny",
                                           "deepseek-v2-lite-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace epmoe
