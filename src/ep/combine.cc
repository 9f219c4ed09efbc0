#include "ep/combine.h"

#include "util/threads.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

namespace epmoe {

void combine_slots(int64_t T, int H, int K, const float* w, const float* rows, float* y) {
  // Tokens split over the threads (prefill reads T * K * H floats here); each token's sum is the
  // same slot-order loop whichever thread runs it.
  parallel_for(T, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, int64_t(K) * H)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; t++) {
      float* yt = y + t * H;
      std::fill(yt, yt + H, 0.0f);
      for (int k = 0; k < K; k++) {
        const float wk = w[t * K + k];
        const float* r = rows + (t * K + k) * H;
        for (int h = 0; h < H; h++) yt[h] += wk * r[h];
      }
    }
  });
}

void run_experts_grouped(int64_t n, int H, const float* in, const int32_t* expert_of,
                         const ExpertFn& expert, float* out) {
  std::map<int32_t, std::vector<int64_t>> by_expert;
  for (int64_t i = 0; i < n; i++) by_expert[expert_of[i]].push_back(i);
  std::vector<std::pair<int32_t, const std::vector<int64_t>*>> groups;
  size_t largest = 0;
  for (auto& [e, idx] : by_expert) {
    groups.push_back({e, &idx});
    largest = std::max(largest, idx.size());
  }
  auto run_group = [&](size_t g) {
    thread_local std::vector<float> xin, xout;  // grow-only scratch, one per thread
    const auto& idx = *groups[g].second;
    const int64_t m = int64_t(idx.size());
    xin.resize(static_cast<size_t>(m * H));
    xout.resize(static_cast<size_t>(m * H));
    for (int64_t j = 0; j < m; j++) std::memcpy(&xin[size_t(j * H)], in + idx[size_t(j)] * H, sizeof(float) * size_t(H));
    expert(groups[g].first, xin.data(), m, xout.data());
    for (int64_t j = 0; j < m; j++) std::memcpy(out + idx[size_t(j)] * H, &xout[size_t(j * H)], sizeof(float) * size_t(H));
  };
  // Many experts (decode, and prefill when no expert holds a large share of the rows): one thread
  // per expert, its matmuls inline, so each thread streams whole experts and the pool is woken
  // once per layer instead of twice per expert (and no thread waits at the end of each matmul).
  // Experts are handed out largest first, one at a time. Few or dominant groups: experts in turn,
  // each matmul split over the threads. Either way a row's bits are the same (the kernels are
  // batch- and thread-invariant).
  const int threads = num_threads();
  if (groups.size() >= size_t(2 * threads) && (largest <= 16 || int64_t(largest) * 2 * threads <= n)) {
    std::vector<size_t> order(groups.size());
    for (size_t g = 0; g < order.size(); g++) order[g] = g;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return groups[a].second->size() > groups[b].second->size(); });
    std::atomic<size_t> next{0};
    parallel_for(threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; r++)
        for (size_t i; (i = next.fetch_add(1)) < order.size();) run_group(order[i]);
    });
  } else {
    for (size_t g = 0; g < groups.size(); g++) run_group(g);
  }
}

}  // namespace epmoe
