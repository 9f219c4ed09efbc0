// --lm-head int8 (model/weights.h LmHeadForm::Int8) on every fixture: the head the model reads is
// the checkpoint's lm_head quantized by tensor/quantize.h (a tied embedding too, which the lookups
// keep reading as stored); every logit stays within the quantization's bound of the exact model's,
//   |dy_v| <= sum_k |h_k| s_vk / 2  <=  max|h| * sum_k s_vk / 2,
// with max|h| (the final normed hidden state) bounded through the exact logits' own magnitudes;
// and the greedy choice agrees wherever the exact top-2 margin is wider than twice that bound.
// The bound used is Cauchy-Schwarz's, |dy_v| <= |h|_2 |w_v - q_v s_v|_2, with |h|_2 <= sqrt(H)
// max|gamma| (every family's final norm is an RMS norm: |x / rms(x)|_2 = sqrt(H)).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/cpu_model.h"
#include "common/golden.h"
#include "tensor/quantize.h"

namespace epmoe {
namespace {

class Int8Head : public ::testing::TestWithParam<std::string> {};

TEST_P(Int8Head, LogitsWithinTheQuantizationBoundOfTheExactModel) {
  test::CpuModel exact(GetParam());
  test::CpuModel q8(GetParam(), {}, LmHeadForm::Int8);
  test::Golden g(GetParam());
  const ModelWeights& w = q8.model.weights();
  ASSERT_TRUE(w.lm_head_int8);
  ASSERT_EQ(w.lm_head.dtype, DType::I8);
  EXPECT_NE(w.embed.dtype, DType::I8);  // lookups read the stored embedding
  // The codes are the quantizer's own of the checkpoint's head.
  const QuantizedMatrix ref = quantize_rows_int8(exact.model.weights().lm_head);
  ASSERT_EQ(ref.codes, w.lm_head_int8->codes);
  ASSERT_EQ(ref.scales, w.lm_head_int8->scales);

  const int64_t V = exact.cfg.vocab_size, H = exact.cfg.hidden_size;
  const std::vector<float>& gamma = exact.model.weights().final_norm;
  float gmax = 0;
  for (float v : gamma) gmax = std::max(gmax, std::fabs(v));
  const double hnorm = std::sqrt(double(H)) * gmax;
  const TensorView& W = exact.model.weights().lm_head;
  std::vector<double> row_err(size_t(V), 0.0);  // |w_v - q_v s_v|_2
  for (int64_t v = 0; v < V; v++) {
    for (int64_t k = 0; k < H; k++) {
      const double d = double(W.at(v * H + k)) - double(w.lm_head.at(v * H + k));
      row_err[size_t(v)] += d * d;
    }
    row_err[size_t(v)] = std::sqrt(row_err[size_t(v)]);
  }
  double worst = 0, worst_bound = 0;
  int agree = 0, compared = 0;
  for (int s = 0; s < g.sequences(); s++) {
    const auto ids = g.ids("seq" + std::to_string(s) + ".all_ids");
    Sequence a = exact.model.new_sequence(0), b = q8.model.new_sequence(0);
    const auto ye = exact.model.forward({&a}, {ids}, *exact.backend, true)[0];
    const auto yq = q8.model.forward({&b}, {ids}, *q8.backend, true)[0];
    ASSERT_EQ(ye.size(), yq.size());
    for (size_t p = 0; p < ids.size(); p++) {
      const float* e = &ye[p * size_t(V)];
      const float* qv = &yq[p * size_t(V)];
      double bound_max = 0;
      for (int64_t v = 0; v < V; v++) {
        const double bound = hnorm * row_err[size_t(v)] * (1 + 1e-4) + 1e-4 * (1 + std::fabs(e[v]));
        const double d = std::fabs(double(qv[v]) - e[v]);
        ASSERT_LE(d, bound) << GetParam() << " seq " << s << " position " << p << " token " << v;
        worst = std::max(worst, d);
        worst_bound = std::max(worst_bound, bound);
        bound_max = std::max(bound_max, bound);
      }
      const int64_t top = std::max_element(e, e + V) - e;
      float second = -INFINITY;
      for (int64_t v = 0; v < V; v++)
        if (v != top) second = std::max(second, e[v]);
      if (e[top] - second > 2 * bound_max) {
        compared++;
        agree += std::max_element(qv, qv + V) - qv == top;
      }
    }
  }
  std::printf("[int8 head] %s: max |logit diff| %.3g (bound %.3g); greedy agrees at %d of %d clear positions\n",
              GetParam().c_str(), worst, worst_bound, agree, compared);
  EXPECT_GT(worst, 0.0);  // the head really is quantized
  EXPECT_EQ(agree, compared);
  EXPECT_GT(compared, 0);  // the bound is tight enough to say something about the choices
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Int8Head, ::testing::ValuesIn(test::all_model_fixtures()), test::FixtureName());

}  // namespace
}  // namespace epmoe
