// The scheduler over the paged KV pool (engine/scheduler.h) on a real model, one rank: whatever
// the pool size, the block size, the token budget, the prefix cache, forking of samples or
// aborts of other requests, every request's tokens and log-probs are the same bits; and the pool
// is whole again at the end.
#include <gtest/gtest.h>

#include <random>

#include "common/cpu_model.h"
#include "common/golden.h"
#include "comm/mpi_group.h"
#include "engine/sampling.h"
#include "engine/scheduler.h"
#include "ep/backend.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "common/vectors.h"

namespace epmoe {
namespace {

// A fixture's model (qwen3moe-tiny) with the given KV pool.
struct Loaded : test::CpuModel {
  explicit Loaded(const KvOptions& kv) : test::CpuModel("qwen3moe-tiny", kv) {}
};

RequestParams sampled(int max_new) {
  RequestParams p;
  p.max_new_tokens = max_new;
  p.sampling.temperature = 0.8f;
  p.sampling.top_k = 40;
  p.logprobs = true;
  p.top_logprobs = 2;
  return p;
}

std::vector<GenerateRequest> workload(int count, int vocab, uint64_t seed, int max_new, bool with_samples) {
  std::mt19937_64 rng(seed);
  std::vector<GenerateRequest> out;
  for (int i = 0; i < count; i++) {
    GenerateRequest r;
    r.id = uint64_t(i) * 4;
    r.prompt.resize(size_t(3 + rng() % 28));
    for (auto& t : r.prompt) t = int32_t(rng() % uint64_t(vocab));
    r.seed = 1000 + uint64_t(i);
    r.n = with_samples && i % 5 == 2 ? 2 : 1;
    r.params = sampled(max_new);
    out.push_back(std::move(r));
  }
  return out;
}

using Results = std::vector<std::vector<Generation>>;

Results run_all(Loaded& m, const std::vector<GenerateRequest>& reqs, SchedulerOptions o = {}) {
  Scheduler s(m.model, *m.backend, MpiGroup::world(), o);
  for (auto& r : reqs) s.submit(r);
  s.run();
  Results out;
  for (size_t h = 0; h < reqs.size(); h++) out.push_back(s.results(h));
  return out;
}

void expect_same(const Generation& a, const Generation& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  EXPECT_TRUE(test::same_bits(a.logprobs, b.logprobs)) << what << ": log-prob bits differ";
  ASSERT_EQ(a.top.size(), b.top.size()) << what;
  for (size_t k = 0; k < a.top.size(); k++) {
    ASSERT_EQ(a.top[k].size(), b.top[k].size()) << what;
    for (size_t q = 0; q < a.top[k].size(); q++) {
      EXPECT_EQ(a.top[k][q].first, b.top[k][q].first) << what;
      EXPECT_EQ(std::memcmp(&a.top[k][q].second, &b.top[k][q].second, sizeof(float)), 0) << what;
    }
  }
  EXPECT_EQ(a.finish, b.finish) << what;
}

void expect_pool_whole(KvPool& pool) {
  EXPECT_EQ(pool.used_blocks(), 0) << "blocks leaked";
  EXPECT_EQ(pool.reserved_blocks(), 0) << "promises leaked";
  EXPECT_EQ(pool.available(), pool.total_blocks());
}

TEST(Scheduler, AWorkloadTenTimesThePoolGivesTheBitsOfAnUnboundedPool) {
  Loaded big({1 << 14, 16}), small({96, 4});
  const auto reqs = workload(32, big.cfg.vocab_size, 5, 14, /*with_samples=*/true);
  int64_t need = 0;
  for (auto& r : reqs) need += int64_t(r.prompt.size() + 14) * r.n;
  ASSERT_GE(need, 10 * 96) << "the workload must need at least 10x the small pool";
  const Results ref = run_all(big, reqs);
  SchedulerOptions tight;
  tight.max_batch_tokens = 7;
  const Results got = run_all(small, reqs, tight);
  for (size_t i = 0; i < reqs.size(); i++)
    for (size_t j = 0; j < ref[i].size(); j++)
      expect_same(ref[i][j], got[i][j], "request " + std::to_string(i) + " sample " + std::to_string(j));
  expect_pool_whole(small.model.kv_pool());
  expect_pool_whole(big.model.kv_pool());
}

TEST(Scheduler, EachRequestAloneGivesTheBitsItGivesAmongOthers) {
  Loaded m({1 << 14, 16});
  const auto reqs = workload(12, m.cfg.vocab_size, 9, 10, /*with_samples=*/false);
  const Results together = run_all(m, reqs);
  for (size_t i = 0; i < reqs.size(); i += 3) {
    const Results alone = run_all(m, {reqs[i]});
    expect_same(alone[0][0], together[i][0], "request " + std::to_string(i));
  }
}

TEST(Scheduler, TheBlockSizeDoesNotChangeTheBits) {
  Loaded b1({4096, 1}), b5({4096, 5}), b16({4096, 16});
  const auto reqs = workload(6, b1.cfg.vocab_size, 3, 8, /*with_samples=*/true);
  const Results r16 = run_all(b16, reqs), r1 = run_all(b1, reqs), r5 = run_all(b5, reqs);
  for (size_t i = 0; i < reqs.size(); i++)
    for (size_t j = 0; j < r16[i].size(); j++) {
      expect_same(r16[i][j], r1[i][j], "block 1, request " + std::to_string(i));
      expect_same(r16[i][j], r5[i][j], "block 5, request " + std::to_string(i));
    }
}

TEST(Scheduler, SamplesOfOnePromptShareItsBlocksAndEqualSeparateRequests) {
  Loaded m({4096, 4});
  GenerateRequest r;
  r.id = 40;
  r.prompt = {5, 17, 2, 99, 31, 8, 64, 12, 3, 77, 41};  // 11 tokens: a shared partial block
  r.seed = 7;
  r.n = 4;
  r.params = sampled(9);
  Scheduler s(m.model, *m.backend, MpiGroup::world(), {});
  const size_t h = s.submit(r);
  s.run();
  EXPECT_EQ(s.stats().prefill_tokens, int64_t(r.prompt.size())) << "the prompt is computed once for 4 samples";
  std::vector<GenerateRequest> apart;
  for (int j = 0; j < 4; j++) {
    GenerateRequest q = r;
    q.id = r.id + uint64_t(j);
    q.seed = r.seed + uint64_t(j);
    q.n = 1;
    apart.push_back(q);
  }
  SchedulerOptions no_cache;
  no_cache.prefix_cache = false;
  const Results sep = run_all(m, apart, no_cache);
  bool differ = false;
  for (int j = 0; j < 4; j++) {
    expect_same(s.results(h)[size_t(j)], sep[size_t(j)][0], "sample " + std::to_string(j));
    differ |= sep[size_t(j)][0].tokens != sep[0][0].tokens;
  }
  EXPECT_TRUE(differ) << "four seeds drew four identical continuations: the test shows nothing";
  expect_pool_whole(m.model.kv_pool());
}

TEST(Scheduler, PrefixCacheHitsEqualRecomputation) {
  Loaded cached({4096, 4}), plain({4096, 4});
  std::vector<int32_t> x;
  for (int i = 0; i < 37; i++) x.push_back(int32_t((i * 37 + 11) % cached.cfg.vocab_size));
  GenerateRequest first{100, x, 1, 1, sampled(6)};
  GenerateRequest same{200, x, 2, 1, sampled(6)};
  std::vector<int32_t> branch(x.begin(), x.begin() + 22);
  branch.insert(branch.end(), {7, 8, 9, 10, 11});
  GenerateRequest shared_head{300, branch, 3, 2, sampled(6)};

  Scheduler s(cached.model, *cached.backend, MpiGroup::world(), {});
  const size_t h0 = s.submit(first);
  s.run();  // the first prompt's blocks are in the cache before the others arrive
  const size_t h1 = s.submit(same), h2 = s.submit(shared_head);
  s.run();
  EXPECT_EQ(s.results(h0)[0].cached_tokens, 0);
  EXPECT_EQ(s.results(h1)[0].cached_tokens, 36) << "9 full blocks of the 37-token prompt";
  EXPECT_EQ(s.results(h2)[0].cached_tokens, 22)
      << "the common 22-token head: 5 full blocks and the first 2 rows of the 6th (copied)";
  EXPECT_GT(cached.model.kv_pool().prefix_hits(), 0);

  SchedulerOptions no_cache;
  no_cache.prefix_cache = false;
  const Results ref = run_all(plain, {first, same, shared_head}, no_cache);
  expect_same(s.results(h1)[0], ref[1][0], "same prompt");
  for (size_t j = 0; j < 2; j++) expect_same(s.results(h2)[j], ref[2][j], "shared head, sample " + std::to_string(j));
  expect_pool_whole(cached.model.kv_pool());
}

TEST(Scheduler, AbortsReturnEveryBlockAndLeaveTheOthersAlone) {
  Loaded m({256, 4});
  const auto reqs = workload(16, m.cfg.vocab_size, 21, 10, /*with_samples=*/true);
  const Results ref = run_all(m, reqs);

  Scheduler s(m.model, *m.backend, MpiGroup::world(), {});
  for (auto& r : reqs) s.submit(r);
  s.abort(15);  // still queued
  s.on_token = [&](size_t h, int, int32_t) {
    if (h % 3 == 1 && s.results(h)[0].tokens.size() == 3) s.abort(h);
  };
  s.run();
  for (size_t h = 0; h < reqs.size(); h++) {
    const auto& got = s.results(h);
    if (h == 15) {
      EXPECT_TRUE(got[0].tokens.empty());
      EXPECT_EQ(got[0].finish, FinishReason::Abort);
    } else if (h % 3 == 1) {
      EXPECT_EQ(got[0].tokens.size(), 3u) << "request " << h;
      EXPECT_EQ(got[0].finish, FinishReason::Abort) << "request " << h;
    } else {
      for (size_t j = 0; j < got.size(); j++) expect_same(got[j], ref[h][j], "request " + std::to_string(h));
    }
  }
  expect_pool_whole(m.model.kv_pool());
}

TEST(Scheduler, ARequestThatCanNeverFitIsRefusedAtSubmit) {
  Loaded m({32, 4});
  Scheduler s(m.model, *m.backend, MpiGroup::world(), {});
  GenerateRequest r;
  r.prompt.assign(30, 3);
  r.params.max_new_tokens = 8;
  try {
    s.submit(r);
    FAIL() << "a request of 37 positions was accepted by a pool of 32";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("raise --kv-cache-tokens to at least 40"), std::string::npos) << e.what();
  }
  r.prompt.assign(20, 3);  // 27 positions: fits
  s.submit(r);
  s.run();
  EXPECT_EQ(s.results(0)[0].tokens.size(), 8u);
}

TEST(Scheduler, PromptLogprobsOfAReScoredRolloutAreItsOwnBits) {
  // A sampled rollout, then its prompt + output re-scored with max_new_tokens 0: the prompt
  // log-probs from the output's first position are the rollout's own log-prob bits, whatever the
  // chunking, and a cached prefix does not hide the positions asked for.
  Loaded m({4096, 4});
  const auto reqs = workload(6, m.cfg.vocab_size, 33, 9, /*with_samples=*/false);
  const Results out = run_all(m, reqs);
  for (int64_t chunk : {int64_t(0), int64_t(5)}) {
    SchedulerOptions o;
    o.max_batch_tokens = chunk;
    Scheduler s(m.model, *m.backend, MpiGroup::world(), o);
    std::vector<size_t> hs;
    for (size_t i = 0; i < reqs.size(); i++) {
      GenerateRequest r = reqs[i];
      r.prompt.insert(r.prompt.end(), out[i][0].tokens.begin(), out[i][0].tokens.end());
      r.params.max_new_tokens = 0;
      r.params.input_logprobs_from = int(i % 2);  // 0 and 1 both start at position 1
      hs.push_back(s.submit(r));
    }
    s.run();
    for (size_t i = 0; i < reqs.size(); i++) {
      const Generation& g = s.results(hs[i])[0];
      const size_t P = reqs[i].prompt.size(), T = out[i][0].tokens.size();
      ASSERT_EQ(g.input_logprobs.size(), P + T - 1) << "request " << i;
      EXPECT_TRUE(g.tokens.empty());
      const std::vector<float> tail(g.input_logprobs.end() - long(T), g.input_logprobs.end());
      EXPECT_TRUE(test::same_bits(tail, out[i][0].logprobs)) << "request " << i << ", chunk " << chunk;
    }
    expect_pool_whole(m.model.kv_pool());
  }
  // From a later position, with the prompt's blocks cached: still computed, still the same bits.
  Scheduler s(m.model, *m.backend, MpiGroup::world(), {});
  GenerateRequest r = reqs[0];
  r.prompt.insert(r.prompt.end(), out[0][0].tokens.begin(), out[0][0].tokens.end());
  r.params.max_new_tokens = 0;
  const size_t warm = s.submit(r);  // puts the blocks in the cache
  s.run();
  EXPECT_EQ(s.results(warm)[0].input_logprobs.size(), 0u) << "no prompt log-probs unless asked";
  r.params.input_logprobs_from = int(reqs[0].prompt.size());
  const size_t h = s.submit(r);
  s.run();
  const Generation& g = s.results(h)[0];
  EXPECT_TRUE(test::same_bits(g.input_logprobs, out[0][0].logprobs));
  EXPECT_GT(g.cached_tokens, 0) << "the head before the scored positions came from the cache";
  EXPECT_LT(g.cached_tokens, int64_t(reqs[0].prompt.size()));
}

TEST(Scheduler, AStopFromOnTokenEndsThatSampleOnlyWithStop) {
  Loaded m({1024, 4});
  auto reqs = workload(4, m.cfg.vocab_size, 44, 12, /*with_samples=*/false);
  reqs[1].n = 2;
  const Results ref = run_all(m, reqs);
  Scheduler s(m.model, *m.backend, MpiGroup::world(), {});
  for (auto& r : reqs) s.submit(r);
  s.on_token = [&](size_t h, int j, int32_t) {
    if (h == 1 && j == 1 && s.results(h)[1].tokens.size() == 4) s.stop_sample(h, j);
  };
  s.run();
  const auto& got = s.results(1);
  EXPECT_EQ(got[1].tokens.size(), 4u);
  EXPECT_EQ(got[1].finish, FinishReason::Stop);
  EXPECT_EQ(got[1].tokens, std::vector<int32_t>(ref[1][1].tokens.begin(), ref[1][1].tokens.begin() + 4));
  expect_same(got[0], ref[1][0], "the other sample");
  for (size_t h : {size_t(0), size_t(2), size_t(3)}) expect_same(s.results(h)[0], ref[h][0], "request " + std::to_string(h));
  expect_pool_whole(m.model.kv_pool());
  s.forget(1);
  EXPECT_TRUE(s.results(1).empty()) << "forget drops the results";
}

// The CPU model behind the device-draw interface (LanguageModel::forward_draw, as the GPU model
// offers it), drawing on the host from forward()'s logits: the scheduler's device-draw path --
// which requests it sends there and how it reads the draws back -- run without a GPU.
class HostDrawsAsDevice : public LanguageModel {
 public:
  explicit HostDrawsAsDevice(LanguageModel& m) : m_(m) {}
  const ModelConfig& config() const override { return m_.config(); }
  Device device() const override { return m_.device(); }
  KvPool& kv_pool() override { return m_.kv_pool(); }
  bool draws_on_device() const override { return true; }
  // The wrapped model's step with each Draw row asking for its logits instead, then the draw
  // from them on the host.
  StepResult step(const StepBatch& batch, A2ABackend& backend) override {
    StepBatch host = batch;
    host.draws.clear();
    for (StepWant& w : host.want)
      if (w == StepWant::Draw) w = StepWant::Logits;
    StepResult out = m_.step(host, backend);
    const int64_t V = config().vocab_size;
    for (const DrawRequest& d : batch.draws) {
      const float* row = out.logits[size_t(d.row)].data();
      SamplingParams sp;
      sp.temperature = d.temperature;
      const RowLogprobs lp(row, V, d.temperature);
      Drawn dr;
      dr.token = sample_token(row, V, sp, d.seed, d.position);
      dr.logprob = lp.at(dr.token);
      dr.top = lp.top(d.top_n);
      top_draws += d.top_n > 0;
      out.drawn.push_back(std::move(dr));
    }
    for (size_t q = 0; q < batch.want.size(); q++)
      if (batch.want[q] == StepWant::Draw) out.logits[q].clear();
    const bool draws = !batch.draws.empty();
    draw_steps += draws;
    return out;
  }
  void mlp_block(int layer, const float* x, int64_t T, const uint64_t* gids, A2ABackend& backend,
                 float* y) override {
    m_.mlp_block(layer, x, T, gids, backend, y);
  }
  int draw_steps = 0, top_draws = 0;

 private:
  LanguageModel& m_;
};

TEST(Scheduler, DeviceDrawsWithTopLogprobsGiveTheHostPathsBits) {
  // logprobs: N no longer keeps a step off the device's draws: the same tokens, log-probs and
  // top-N (ids, order, bits, shape) as the host path, greedy and sampled, N = 1 .. 20, with n = 2.
  Loaded m({4096, 16});
  auto reqs = workload(8, m.cfg.vocab_size, 21, 7, /*with_samples=*/true);
  const int tops[] = {0, 1, 3, 20};
  for (size_t i = 0; i < reqs.size(); i++) {
    RequestParams& p = reqs[i].params;
    p.sampling.top_k = -1;  // (masks stay on the host)
    p.sampling.temperature = i % 3 == 0 ? 0.0f : (i % 3 == 1 ? 0.7f : 1.3f);
    p.top_logprobs = tops[i % 4];
    p.logprobs = i % 2 == 0;
  }
  const Results host = run_all(m, reqs);
  HostDrawsAsDevice dev(m.model);
  Scheduler s(dev, *m.backend, MpiGroup::world(), {});
  for (auto& r : reqs) s.submit(r);
  s.run();
  EXPECT_GT(dev.draw_steps, 0) << "the steps drew on the 'device'";
  EXPECT_GT(dev.top_draws, 0) << "draws with top_logprobs went to the 'device'";
  for (size_t i = 0; i < reqs.size(); i++) {
    const auto& got = s.results(i);
    ASSERT_EQ(got.size(), host[i].size());
    for (size_t j = 0; j < got.size(); j++) {
      expect_same(got[j], host[i][j], "request " + std::to_string(i) + " sample " + std::to_string(j));
      if (reqs[i].params.top_logprobs > 0) {
        for (const auto& step : got[j].top) EXPECT_EQ(step.size(), size_t(reqs[i].params.top_logprobs));
      }
    }
  }
  // A mask (top-k) keeps its steps on the host: nothing of them reaches forward_draw.
  HostDrawsAsDevice masked(m.model);
  reqs[0].params.sampling.top_k = 5;
  reqs[0].params.sampling.temperature = 0.8f;
  Scheduler s2(masked, *m.backend, MpiGroup::world(), {});
  s2.submit(reqs[0]);
  s2.run();
  EXPECT_EQ(masked.draw_steps, 0);
  expect_pool_whole(m.model.kv_pool());
}

}  // namespace
}  // namespace epmoe
