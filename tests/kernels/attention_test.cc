// causal_attention (kernels/attention.h) on both kernel paths: held against the double-precision
// definition on odd shapes (head dims that are not multiples of 16, odd query groups, block sizes
// that cut rows anywhere, a cache that already holds a prefix), and bit for bit batch-invariant:
// a token's context is the same bits whether it is computed in one prefill, in chunks, token by
// token, beside other sequences, with any thread count, or over a cache paged in other blocks. The
// generic path is also held to the plain per-row loop (vec.h dot, ops.h softmax, axpy) bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "kernels/attention.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/vec.h"
#include "util/threads.h"

namespace epmoe {
namespace {

// One sequence's cache: positions [0, len) with K and V rows of kv_heads * D floats, in blocks of
// B rows placed in a pool in shuffled order (as a paged cache hands them out).
struct Cache {
  int64_t B, width;
  std::vector<float> pool_k, pool_v;
  std::vector<const float*> kb, vb;
  Cache(int64_t len, int64_t B_, int64_t width_, const std::vector<float>& k, const std::vector<float>& v,
        uint32_t seed)
      : B(B_), width(width_) {
    const int64_t blocks = (len + B - 1) / B + 1;  // one spare, so slots really move around
    pool_k.assign(size_t(blocks * B * width), NAN);
    pool_v.assign(size_t(blocks * B * width), NAN);
    std::vector<int64_t> slot(static_cast<size_t>(blocks));
    std::iota(slot.begin(), slot.end(), 0);
    std::shuffle(slot.begin(), slot.end(), std::mt19937(seed));
    for (int64_t b = 0; b * B < len; b++) {
      kb.push_back(&pool_k[size_t(slot[size_t(b)] * B * width)]);
      vb.push_back(&pool_v[size_t(slot[size_t(b)] * B * width)]);
    }
    for (int64_t j = 0; j < len; j++) {
      std::memcpy(const_cast<float*>(kb[size_t(j / B)]) + (j % B) * width, &k[size_t(j * width)], sizeof(float) * size_t(width));
      std::memcpy(const_cast<float*>(vb[size_t(j / B)]) + (j % B) * width, &v[size_t(j * width)], sizeof(float) * size_t(width));
    }
  }
  KvRows krows() const { return KvRows{kb.data(), B, width}; }
  KvRows vrows() const { return KvRows{vb.data(), B, width}; }
};

// A sequence of `len` positions: q rows [len, heads * D] and K, V rows [len, kv_heads * D].
struct SeqData {
  std::vector<float> q, k, v;
  SeqData(int64_t len, const AttentionDims& d, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.f, 1.f);
    q.resize(size_t(len * d.heads * d.head_dim));
    k.resize(size_t(len * d.kv_heads * d.head_dim));
    v.resize(k.size());
    for (auto& x : q) x = 2.f * n(rng);  // scores of a few units: a softmax that is not flat
    for (auto& x : k) x = n(rng);
    for (auto& x : v) x = n(rng);
  }
};

// ctx of positions [from, from + n) of the sequence, computed in one call over a cache of
// from + n positions with block size B (other = a second sequence in the same call, or none).
std::vector<float> attend(const AttentionDims& d, const SeqData& s, int64_t from, int64_t n, int64_t B, bool ref = false,
                          const SeqData* other = nullptr, int64_t other_len = 0) {
  const int64_t qd = int64_t(d.heads) * d.head_dim, kvd = int64_t(d.kv_heads) * d.head_dim;
  Cache c(from + n, B, kvd, s.k, s.v, uint32_t(B * 7 + from));
  std::vector<AttentionSeq> seqs;
  std::vector<float> q;
  if (other) {  // the other sequence's whole prompt first, then ours
    q.insert(q.end(), other->q.begin(), other->q.begin() + other_len * qd);
  }
  const int64_t t0 = int64_t(q.size()) / qd;
  q.insert(q.end(), s.q.begin() + from * qd, s.q.begin() + (from + n) * qd);
  std::unique_ptr<Cache> oc;
  if (other) {
    oc = std::make_unique<Cache>(other_len, B, kvd, other->k, other->v, 99);
    seqs.push_back({0, other_len, 0, oc->krows(), oc->vrows()});
  }
  seqs.push_back({t0, n, from, c.krows(), c.vrows()});
  std::vector<float> ctx(q.size(), NAN);
  if (ref) causal_attention_ref(d, seqs, q.data(), ctx.data());
  else causal_attention(d, seqs, q.data(), ctx.data());
  return std::vector<float>(ctx.begin() + t0 * qd, ctx.end());
}

struct Shape {
  int heads, kv_heads, D;
};
const Shape kShapes[] = {{32, 4, 128}, {8, 8, 64}, {10, 2, 24}, {6, 2, 8}, {4, 1, 40}, {12, 4, 96}};

class AttentionPaths : public ::testing::TestWithParam<KernelPath> {
 protected:
  void SetUp() override {
    if (GetParam() == KernelPath::Avx512 && !cpu_features().avx512) GTEST_SKIP() << "CPU without AVX-512";
    if (GetParam() == KernelPath::Avx2 && !(cpu_features().avx2 && cpu_features().fma))
      GTEST_SKIP() << "CPU without AVX2 + FMA";
    set_kernel_path(GetParam());
  }
  void TearDown() override {
    set_kernel_path(KernelPath::Auto);
    set_num_threads(0);
  }
};

TEST_P(AttentionPaths, MatchesDoubleDefinition) {
  for (const Shape& sh : kShapes) {
    const AttentionDims d{sh.heads, sh.kv_heads, sh.D, 1.0f / std::sqrt(float(sh.D))};
    const int64_t from = 37, n = 45;
    const SeqData s(from + n, d, uint32_t(sh.D));
    const std::vector<float> got = attend(d, s, from, n, 16), want = attend(d, s, from, n, 16, true);
    double worst = 0;
    for (size_t i = 0; i < got.size(); i++) {
      ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
      worst = std::max(worst, double(std::fabs(got[i] - want[i])));
    }
    // Contexts are averages of N(0, 1) values: a few fp32 ulps of 1.
    EXPECT_LT(worst, 2e-6) << sh.heads << "/" << sh.kv_heads << " heads, D " << sh.D;
    EXPECT_GT(worst, 0.0) << "the fp32 kernel equal to the double definition everywhere: the check is not checking";
  }
}

TEST_P(AttentionPaths, ATokensBitsDoNotDependOnChunkingThreadsBlocksOrNeighbours) {
  for (const Shape& sh : kShapes) {
    const AttentionDims d{sh.heads, sh.kv_heads, sh.D, 1.0f / std::sqrt(float(sh.D))};
    const int64_t len = 70, qd = int64_t(d.heads) * d.head_dim;
    const SeqData s(len, d, 7u + uint32_t(sh.heads)), other(33, d, 1234);
    set_num_threads(2);
    const std::vector<float> whole = attend(d, s, 0, len, 16);
    std::vector<std::vector<float>> variants;
    {  // chunks of 1, 3, 11 and the rest
      std::vector<float> v;
      for (int64_t a = 0, step = 1; a < len; a += step, step = step == 1 ? 3 : 11) {
        const int64_t n = std::min(step, len - a);
        const auto part = attend(d, s, a, n, 16);
        v.insert(v.end(), part.begin(), part.end());
      }
      variants.push_back(v);
    }
    {  // token by token (decode)
      std::vector<float> v;
      for (int64_t a = 0; a < len; a++) {
        const auto part = attend(d, s, a, 1, 16);
        v.insert(v.end(), part.begin(), part.end());
      }
      variants.push_back(v);
    }
    for (int64_t B : {1, 5, 64}) variants.push_back(attend(d, s, 0, len, B));
    variants.push_back(attend(d, s, 0, len, 16, false, &other, 33));
    for (int threads : {1, 3}) {
      set_num_threads(threads);
      variants.push_back(attend(d, s, 0, len, 16));
    }
    set_num_threads(2);
    for (size_t i = 0; i < variants.size(); i++) {
      ASSERT_EQ(variants[i].size(), whole.size());
      for (size_t e = 0; e < whole.size(); e++)
        ASSERT_EQ(std::memcmp(&variants[i][e], &whole[e], 4), 0)
            << "variant " << i << ", token " << e / size_t(qd) << ", head " << (e % size_t(qd)) / size_t(d.head_dim)
            << " (" << sh.heads << "/" << sh.kv_heads << " heads, D " << sh.D << "): " << variants[i][e] << " vs "
            << whole[e];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, AttentionPaths, ::testing::Values(KernelPath::Generic, KernelPath::Avx2, KernelPath::Avx512),
                         [](const auto& info) {
                           return info.param == KernelPath::Generic ? "generic"
                                  : info.param == KernelPath::Avx2  ? "avx2"
                                                                    : "avx512";
                         });

// The AVX2 twins (scores, softmax, context) give the AVX-512 path's bits on every shape, prefill
// and decode, in a paged cache. Needs a CPU with both.
TEST(Attention, Avx2GivesTheAvx512Bits) {
  if (!cpu_features().avx512 || !cpu_features().fma) GTEST_SKIP() << "CPU without AVX-512: nothing to compare with";
  for (const Shape& sh : kShapes)
    for (int64_t len : {1, 7, 16, 17, 45, 130}) {
      const AttentionDims d{sh.heads, sh.kv_heads, sh.D, 1.0f / std::sqrt(float(sh.D))};
      const SeqData s(len, d, uint32_t(len * 31 + sh.D));
      set_kernel_path(KernelPath::Avx2);
      const std::vector<float> a = attend(d, s, 0, len, 16), a_dec = attend(d, s, len - 1, 1, 5);
      set_kernel_path(KernelPath::Avx512);
      const std::vector<float> b = attend(d, s, 0, len, 16), b_dec = attend(d, s, len - 1, 1, 5);
      set_kernel_path(KernelPath::Auto);
      ASSERT_EQ(a.size(), b.size());
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << sh.heads << "/" << sh.kv_heads << " D " << sh.D << " len " << len;
      ASSERT_EQ(0, std::memcmp(a_dec.data(), b_dec.data(), a_dec.size() * sizeof(float))) << "decode, len " << len;
    }
}

// The generic path is the plain loop of the model's first attention, bit for bit.
TEST(Attention, GenericPathIsThePlainLoop) {
  set_kernel_path(KernelPath::Generic);
  const AttentionDims d{12, 4, 40, 0.158f};
  const int64_t len = 29, qd = 12 * 40, kvd = 4 * 40;
  const SeqData s(len, d, 5);
  const std::vector<float> got = attend(d, s, 0, len, 16);
  for (int64_t i = 0; i < len; i++)
    for (int h = 0; h < d.heads; h++) {
      const float* qh = &s.q[size_t(i * qd + h * d.head_dim)];
      const int64_t off = (h / 3) * d.head_dim;
      std::vector<float> p(static_cast<size_t>(i + 1));
      for (int64_t j = 0; j <= i; j++) p[size_t(j)] = dot(qh, &s.k[size_t(j * kvd + off)], d.head_dim) * d.scale;
      softmax(p.data(), i + 1);
      std::vector<float> o(static_cast<size_t>(d.head_dim), 0.f);
      for (int64_t j = 0; j <= i; j++) axpy(p[size_t(j)], &s.v[size_t(j * kvd + off)], o.data(), d.head_dim);
      ASSERT_EQ(std::memcmp(o.data(), &got[size_t(i * qd + h * d.head_dim)], sizeof(float) * size_t(d.head_dim)), 0)
          << "token " << i << " head " << h;
    }
  set_kernel_path(KernelPath::Auto);
}

}  // namespace
}  // namespace epmoe
