#include "ep/cpu_expert_jobs.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "util/error.h"
#include "util/threads.h"

namespace epmoe {

void run_jobs_grouped(const ExpertJobs& j, int H, int p0, int n_local, const ExpertRowsFn& fn, float* out) {
  EPMOE_ASSERT(j.rows_dev == nullptr, "ExpertJobs on the CPU: rows_dev is a device-side count");
  const float* x = static_cast<const float*>(j.x);
  // The plan: per local expert, its jobs' source rows and output rows, in (row, slot) order.
  // Grow-only, kept per calling thread; the workers below see the caller's through references
  // (naming a thread_local inside the lambda would name the worker's own).
  thread_local std::vector<std::vector<int64_t>> src_tls, dst_tls;
  auto& src = src_tls;
  auto& dst = dst_tls;
  src.resize(size_t(std::max(n_local, 0)));
  dst.resize(size_t(std::max(n_local, 0)));
  for (auto& v : src) v.clear();
  for (auto& v : dst) v.clear();
  int64_t served = 0;
  for (int64_t r = 0; r < j.rows; r++) {
    if (j.row_base) j.row_base[r] = int32_t(served);
    const int32_t* ids = j.phys + r * j.phys_stride;
    for (int k = 0; k < j.K; k++) {
      const int q = ids[k] - p0;
      if (ids[k] < 0 || q < 0 || q >= n_local) continue;
      src[size_t(q)].push_back(r);
      dst[size_t(q)].push_back(j.compact ? served : j.one_per_row ? r : r * j.K + k);
      served++;
    }
  }
  if (j.row_base) j.row_base[j.rows] = int32_t(served);

  std::vector<int> groups;
  size_t largest = 0;
  for (int q = 0; q < n_local; q++)
    if (!src[size_t(q)].empty()) {
      groups.push_back(q);
      largest = std::max(largest, src[size_t(q)].size());
    }
  auto run_group = [&](int q) {
    thread_local std::vector<float> xin, xout;  // grow-only scratch, one per thread
    const auto& s = src[size_t(q)];
    const auto& d = dst[size_t(q)];
    const int64_t m = int64_t(s.size());
    xin.resize(static_cast<size_t>(m * H));
    xout.resize(static_cast<size_t>(m * H));
    for (int64_t i = 0; i < m; i++)
      std::memcpy(&xin[size_t(i * H)], x + s[size_t(i)] * j.x_stride, sizeof(float) * size_t(H));
    fn(p0 + q, xin.data(), m, xout.data());
    for (int64_t i = 0; i < m; i++)
      std::memcpy(out + d[size_t(i)] * H, &xout[size_t(i * H)], sizeof(float) * size_t(H));
  };
  // Many experts (decode, and prefill when no expert holds a large share of the rows): one thread
  // per expert, its matmuls inline, so each thread streams whole experts and the pool is woken
  // once per layer instead of twice per expert (and no thread waits at the end of each matmul).
  // Experts are handed out largest first, one at a time. Few or dominant groups: experts in turn,
  // each matmul split over the threads. Either way a row's bits are the same (the kernels are
  // batch- and thread-invariant).
  const int threads = num_threads();
  if (groups.size() >= size_t(2 * threads) && (largest <= 16 || int64_t(largest) * 2 * threads <= served)) {
    std::vector<int> order = groups;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return src[size_t(a)].size() > src[size_t(b)].size(); });
    std::atomic<size_t> next{0};
    parallel_for(threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; r++)
        for (size_t i; (i = next.fetch_add(1)) < order.size();) run_group(order[i]);
    });
  } else {
    for (int q : groups) run_group(q);
  }
}

}  // namespace epmoe
