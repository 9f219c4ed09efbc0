// Latent attention (DeepSeek-V2/V3, GLM-4.7-Flash) and FP8 checkpoints beyond the goldens:
//   - the bits of a sequence's logits do not depend on the batch it shares a forward with or on
//     how its tokens are chunked (the latent cache, the absorbed attention and the fp8 kernels
//     are batch-invariant like the rest);
//   - an FP8 checkpoint's weights dequantize to exactly what the fixture generator computed
//     (dequant_ref.safetensors: code * scale in fp32), and in fp32 compute a matmul over them gives
//     the bits of the F32 matmul of those dequantized weights.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "common/cpu_model.h"
#include "common/golden.h"
#include "io/safetensors.h"
#include "kernels/matmul.h"
#include "common/vectors.h"

namespace epmoe {
namespace {

std::vector<std::string> mla_and_fp8() {
  auto v = test::mla_fixtures();
  for (auto& f : test::fp8_fixtures()) v.push_back(f);
  return v;
}

class MlaFp8 : public ::testing::TestWithParam<std::string> {};

TEST_P(MlaFp8, BitsDoNotDependOnBatchOrChunking) {
  test::CpuModel m(GetParam());
  test::Golden g(GetParam());
  const auto a = g.ids("seq1.all_ids"), b = g.ids("seq0.all_ids");
  // Alone, in one forward.
  Sequence alone = m.model.new_sequence(0);
  const auto ref = m.model.forward({&alone}, {a}, *m.backend, true)[0];
  // In chunks of 5, 1, 7 and the rest, beside another sequence fed in other chunks.
  Sequence s1 = m.model.new_sequence(0), s2 = m.model.new_sequence(1);
  std::vector<float> got;
  size_t pa = 0, pb = 0;
  for (size_t step : {5u, 1u, 7u, 1000u}) {
    const size_t na = std::min(step, a.size() - pa), nb = std::min(step + 2, b.size() - pb);
    std::vector<int32_t> ca(a.begin() + long(pa), a.begin() + long(pa + na)), cb(b.begin() + long(pb), b.begin() + long(pb + nb));
    auto out = m.model.forward({&s2, &s1}, {cb, ca}, *m.backend, true);
    got.insert(got.end(), out[1].begin(), out[1].end());
    pa += na;
    pb += nb;
  }
  ASSERT_EQ(pa, a.size());
  EXPECT_TRUE(test::same_bits(got, ref)) << GetParam() << ": max |diff| " << test::max_abs_diff(got, ref);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MlaFp8, ::testing::ValuesIn(mla_and_fp8()), test::FixtureName());

// Every weight view of a loaded model by its checkpoint name.
std::map<std::string, TensorView> views_by_name(const ModelWeights& w) {
  std::map<std::string, TensorView> out;
  auto add = [&](const TensorView& v) {
    if (!v.empty()) out[v.name] = v;
  };
  auto add_swiglu = [&](const SwigluWeights& s) {
    add(s.gate);
    add(s.up);
    add(s.down);
  };
  for (const LayerWeights& L : w.layers) {
    for (const TensorView* v : {&L.attn.q, &L.attn.k, &L.attn.v, &L.attn.o, &L.attn.mla.q, &L.attn.mla.q_a,
                                &L.attn.mla.q_b, &L.attn.mla.kv_a, &L.attn.mla.kv_b})
      add(*v);
    add_swiglu(L.dense);
    add_swiglu(L.moe.shared);
    for (const auto& [e, s] : L.moe.experts) add_swiglu(s);
  }
  return out;
}

class Fp8Checkpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8Checkpoint, DequantizesToTheGeneratorsWeightsBitForBit) {
  test::CpuModel m(GetParam());
  const auto views = views_by_name(m.model.weights());
  SafetensorsFile ref(test::fixture(GetParam()) + "/dequant_ref.safetensors");
  int compared = 0;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const std::string& name : ref.names()) {
    SCOPED_TRACE(name);
    auto it = views.find(name);
    ASSERT_NE(it, views.end()) << "the model does not load " << name;
    const TensorView& q = it->second;
    const TensorView r = ref.get(name);
    ASSERT_EQ(q.dtype, DType::F8_E4M3);
    ASSERT_EQ(r.shape, q.shape);
    for (int64_t i = 0; i < r.numel(); i++) {
      const float want = r.at(i), got = q.at(i);
      ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << "element " << i << ": " << got << " vs " << want;
    }
    // The kernels, fp32 compute: the F32 matmul's bits, at a decode and a prefill size.
    for (int64_t T : {1, 9}) {
      std::vector<float> x(size_t(T * q.shape[1]));
      for (auto& v : x) v = u(rng);
      std::vector<float> y8(size_t(T * q.shape[0])), y32(y8.size());
      matmul(x.data(), T, q, y8.data(), ComputeMode::F32);
      matmul(x.data(), T, r, y32.data(), ComputeMode::F32);
      EXPECT_TRUE(test::same_bits(y8, y32)) << "T = " << T << ", max |diff| " << test::max_abs_diff(y8, y32);
    }
    compared++;
  }
  EXPECT_GT(compared, 5);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Fp8Checkpoint, ::testing::ValuesIn(test::fp8_fixtures()), test::FixtureName());

}  // namespace
}  // namespace epmoe
