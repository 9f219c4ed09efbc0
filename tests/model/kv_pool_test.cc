// The KV pool's bookkeeping alone (model/kv_pool.h): promises, copy on write, the prefix cache,
// eviction and the return of every block. The K/V values are the models' (tests/engine/ and
// tests/model/golden_test.cc hold those to bits); here a fake copier records the copies.
#include <gtest/gtest.h>

#include <numeric>

#include "model/kv_pool.h"
#include "model/language_model.h"
#include "util/error.h"

namespace epmoe {
namespace {

std::vector<int32_t> iota(int n, int from = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(KvPool, AppendTakesBlocksAndReleaseReturnsThem) {
  KvPool pool(8, 4);
  {
    auto c = pool.open();
    const auto t = iota(10);
    pool.append(*c, t.data(), 10);
    EXPECT_EQ(c->blocks().size(), 3u);
    EXPECT_EQ(c->tokens(), 10);
    EXPECT_EQ(pool.used_blocks(), 3);
    EXPECT_EQ(pool.cached_blocks(), 0);
  }
  // The two full blocks stay findable; the partial one is free again.
  EXPECT_EQ(pool.used_blocks(), 0);
  EXPECT_EQ(pool.cached_blocks(), 2);
  EXPECT_EQ(pool.available(), 8);
}

TEST(KvPool, AnUnpromisedWriteBeyondThePoolThrows) {
  KvPool pool(2, 4);
  auto c = pool.open();
  const auto t = iota(9);
  EXPECT_THROW(pool.append(*c, t.data(), 9), KvPoolFull);
}

TEST(KvPool, PromisesAreKeptAndOthersAreRefused) {
  KvPool pool(6, 4);
  auto a = pool.admit(iota(5), 4, 12);  // 3 blocks promised
  ASSERT_TRUE(a);
  EXPECT_EQ(a->reserved(), 3);
  EXPECT_EQ(pool.available(), 3);
  EXPECT_FALSE(pool.admit(iota(5, 100), 4, 16));  // 4 blocks: does not fit now
  auto b = pool.admit(iota(5, 100), 4, 12);
  ASSERT_TRUE(b);
  EXPECT_EQ(pool.available(), 0);
  // An unpromised sequence cannot take what is promised.
  auto c = pool.open();
  const int32_t one = 1;
  EXPECT_THROW(pool.append(*c, &one, 1), KvPoolFull);
  // The promised ones write all they were promised.
  const auto t = iota(12);
  pool.append(*a, t.data(), 12);
  EXPECT_EQ(a->reserved(), 0);
  EXPECT_EQ(pool.used_blocks(), 3);
  b.reset();  // its promise goes back with it
  EXPECT_EQ(pool.available(), 3);
}

TEST(KvPool, PrefixCacheFindsFullBlocksOfTheSamePrefixOnly) {
  KvPool pool(16, 4);
  const auto prompt = iota(10);
  {
    auto a = pool.admit(prompt, 9, 10);
    ASSERT_TRUE(a);
    EXPECT_EQ(a->tokens(), 0);  // nothing cached yet
    pool.append(*a, prompt.data(), 10);
  }
  auto b = pool.admit(prompt, 9, 10);  // the same prompt: both full blocks
  ASSERT_TRUE(b);
  EXPECT_EQ(b->tokens(), 8);
  EXPECT_EQ(pool.prefix_hits(), 2);
  auto limited = pool.admit(prompt, 7, 10);  // at most 7 tokens: one block
  ASSERT_TRUE(limited);
  EXPECT_EQ(limited->tokens(), 4);
  std::vector<int32_t> other = prompt;
  other[5] = 99;  // differs in the second block: only the first is shared
  auto c = pool.admit(other, 9, 10);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->tokens(), 4);
  std::vector<int32_t> shifted = iota(10, 1);  // nothing in common
  auto d = pool.admit(shifted, 9, 10);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->tokens(), 0);
  // Shared blocks are the same blocks.
  EXPECT_EQ(b->blocks()[0], c->blocks()[0]);
  EXPECT_EQ(b->blocks()[0], limited->blocks()[0]);
}

// Token by token: past the full blocks, the cached block that shares the most leading tokens
// gives those rows, copied into a block of the new sequence's own (the cached one stays as it is).
TEST(KvPool, APrefixPastItsFullBlocksReusesTheLeadingRowsOfTheNext) {
  std::vector<std::pair<int32_t, int32_t>> copies;
  KvPool pool(16, 4, [&](int32_t s, int32_t d) { copies.push_back({s, d}); });
  const auto prompt = iota(12);
  std::vector<int32_t> cached_blocks;
  {
    auto a = pool.admit(prompt, 11, 12);
    ASSERT_TRUE(a);
    pool.append(*a, prompt.data(), 12);
    cached_blocks = a->blocks();
  }
  std::vector<int32_t> other = prompt;
  other[6] = 99;  // shares 6 tokens: block 0 whole, then 2 rows of block 1
  auto b = pool.admit(other, 11, 12);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->tokens(), 6);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].first, cached_blocks[1]);
  ASSERT_EQ(b->blocks().size(), 2u);
  EXPECT_EQ(b->blocks()[0], cached_blocks[0]);  // the full block shared
  EXPECT_EQ(copies[0].second, b->blocks()[1]);  // the partial one its own
  EXPECT_NE(b->blocks()[1], cached_blocks[1]);
  EXPECT_EQ(pool.partial_hit_tokens(), 2);
  // Writing on from row 2 of its own block copies nothing more, and the chain goes on from there.
  pool.append(*b, other.data() + 6, 6);
  EXPECT_EQ(copies.size(), 1u);
  EXPECT_EQ(b->tokens(), 12);
  // The limit holds: at most 5 tokens -> one block and 1 row.
  auto c = pool.admit(prompt, 5, 12);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->tokens(), 5);
  // Nothing in common past the first block: the full block only, no copy.
  std::vector<int32_t> third = prompt;
  third[4] = 77;
  const size_t before = copies.size();
  auto d = pool.admit(third, 11, 12);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->tokens(), 4);
  EXPECT_EQ(copies.size(), before);
  // A flush forgets the candidates too.
  b.reset(), c.reset(), d.reset();
  pool.flush_prefix_cache();
  auto e = pool.admit(other, 11, 12);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->tokens(), 0);
  e.reset();
  EXPECT_EQ(pool.used_blocks(), 0);
  EXPECT_EQ(pool.reserved_blocks(), 0);
}

TEST(KvPool, ForkSharesBlocksAndCopiesThePartialOneOnWrite) {
  std::vector<std::pair<int32_t, int32_t>> copies;
  KvPool pool(16, 4, [&](int32_t s, int32_t d) { copies.push_back({s, d}); });
  const auto prompt = iota(6);
  auto a = pool.admit(prompt, 0, 8, /*extra=*/1 + 2);  // parent + one copy, and one fork of 2 blocks
  ASSERT_TRUE(a);
  pool.append(*a, prompt.data(), 6);
  auto f = pool.fork(*a, 2);
  EXPECT_EQ(f->blocks(), a->blocks());
  EXPECT_EQ(pool.used_blocks(), 2);
  const int32_t x = 50, y = 60;
  pool.append(*a, &x, 1);  // the partial block is shared: the parent writes into a copy
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].first, f->blocks()[1]);
  EXPECT_EQ(copies[0].second, a->blocks()[1]);
  EXPECT_EQ(a->blocks()[0], f->blocks()[0]);  // the full block stays shared
  pool.append(*f, &y, 1);  // now the fork holds the old partial block alone: no copy
  EXPECT_EQ(copies.size(), 1u);
  EXPECT_EQ(pool.used_blocks(), 3);
  a.reset();
  f.reset();
  EXPECT_EQ(pool.used_blocks(), 0);
  EXPECT_EQ(pool.reserved_blocks(), 0);
}

TEST(KvPool, CachedBlocksAreEvictedLeastRecentlyUsedFirst) {
  KvPool pool(4, 2);
  for (int r = 0; r < 2; r++) {  // two prompts of 2 full blocks each fill the pool with cached blocks
    auto c = pool.open();
    const auto t = iota(4, 10 * r);
    pool.append(*c, t.data(), 4);
  }
  EXPECT_EQ(pool.cached_blocks(), 4);
  {
    auto again = pool.admit(iota(4, 0), 4, 4);  // touches prompt 0: prompt 1 is now the older
    ASSERT_TRUE(again);
    EXPECT_EQ(again->tokens(), 4);
  }
  {
    auto fresh = pool.open();  // two new blocks evict prompt 1's
    const auto t = iota(4, 100);
    pool.append(*fresh, t.data(), 3);
  }
  EXPECT_EQ(pool.admit(iota(4, 0), 4, 4)->tokens(), 4);
  EXPECT_EQ(pool.admit(iota(4, 10), 4, 4)->tokens(), 0);
}

TEST(KvPool, FlushForgetsEveryPrefix) {
  KvPool pool(8, 2);
  {
    auto c = pool.open();
    const auto t = iota(6);
    pool.append(*c, t.data(), 6);
  }
  EXPECT_EQ(pool.cached_blocks(), 3);
  pool.flush_prefix_cache();
  EXPECT_EQ(pool.cached_blocks(), 0);
  EXPECT_EQ(pool.admit(iota(6), 6, 6)->tokens(), 0);
  EXPECT_EQ(pool.available(), 8);
}

// The pool's default size (kv_pool_tokens): on the GPU what the weights leave under the memory
// fraction of the device (sglang's --mem-fraction-static), capped at 1M positions, in whole blocks;
// a fraction that leaves no block is refused naming the flag.
TEST(KvPoolSize, GpuDefaultIsWhatTheWeightsLeaveUnderTheMemFraction) {
  const int64_t GiB = int64_t(1) << 30, total = 140 * GiB, per_token = 98304;  // 48 layers, bf16
  KvOptions o;
  o.block_tokens = 16;
  // 80 GiB free after the weights, 20% of 140 GiB kept back: 52 GiB for the pool.
  const int64_t budget = 80 * GiB - int64_t((1.0 - kDefaultGpuMemFraction) * double(total));
  EXPECT_EQ(kv_pool_tokens(o, Device::Cuda, 80 * GiB, per_token, total), (budget / per_token + 15) / 16 * 16);
  o.mem_fraction = 0.7;
  const int64_t budget70 = 80 * GiB - int64_t(0.3 * double(total));
  EXPECT_EQ(kv_pool_tokens(o, Device::Cuda, 80 * GiB, per_token, total), (budget70 / per_token + 15) / 16 * 16);
  // fp32 values: twice the bytes, half the positions.
  EXPECT_NEAR(double(kv_pool_tokens(o, Device::Cuda, 80 * GiB, 2 * per_token, total)),
              double(kv_pool_tokens(o, Device::Cuda, 80 * GiB, per_token, total)) / 2, 16);
  o.mem_fraction = 0.4;  // less than the weights already hold
  try {
    kv_pool_tokens(o, Device::Cuda, 80 * GiB, per_token, total);
    ADD_FAILURE() << "a fraction below the weights' share must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--mem-fraction 0.40"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--kv-cache-tokens"), std::string::npos) << e.what();
  }
  // Tiny models hit the 1M cap; a given --kv-cache-tokens wins (rounded up to a block).
  EXPECT_EQ(kv_pool_tokens(KvOptions{}, Device::Cuda, 80 * GiB, 64, total), 1 << 20);
  EXPECT_EQ(kv_pool_tokens(KvOptions{100, 16}, Device::Cuda, 0, per_token, total), 112);
  // The CPU keeps its quarter of the available memory.
  EXPECT_EQ(kv_pool_tokens(KvOptions{}, Device::Cpu, 16 * GiB, per_token), (4 * GiB / per_token + 15) / 16 * 16);
}

TEST(KvPoolSize, KvCacheDtypeNames) {
  EXPECT_EQ(parse_kv_dtype("auto"), KvDtype::Auto);
  EXPECT_EQ(parse_kv_dtype("bf16"), KvDtype::BF16);
  EXPECT_EQ(parse_kv_dtype("fp32"), KvDtype::F32);
  EXPECT_THROW(parse_kv_dtype("fp8"), InputError);
  EXPECT_STREQ(kv_dtype_name(KvDtype::BF16), "bf16");
}

}  // namespace
}  // namespace epmoe
