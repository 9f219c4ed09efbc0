// ExpertJobs on the CPU (src/ep/cpu_expert_jobs.h) against a plain reference written from the
// contract in ep/backend.h: which (row, slot) jobs are served (ids in this rank's range only),
// where each output row goes (default, compact, one_per_row), row_base, and that rows are read in
// place through x_stride and phys_stride (as received records are).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ep/cpu_expert_jobs.h"
#include "util/threads.h"

namespace epmoe {
namespace {

// Expert p maps a row x to (p + 1) * x + p: every output row shows which expert served which row.
void probe(int p, const float* in, int64_t n, int H, float* out) {
  for (int64_t i = 0; i < n * H; i++) out[i] = float(p + 1) * in[i] + float(p);
}

struct Case {
  int64_t rows;
  int K, H, p0, n_local;
  int64_t x_stride, phys_stride;  // in elements, >= H and >= K
};

void check(const Case& c, bool compact, bool one_per_row, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(size_t(c.rows * c.x_stride));
  for (auto& v : x) v = float(int(rng() % 2001) - 1000) / 64.0f;
  std::vector<int32_t> phys(size_t(c.rows * c.phys_stride), 12345);  // padding never read as an id
  for (int64_t r = 0; r < c.rows; r++) {
    int served = 0;
    for (int k = 0; k < c.K; k++) {
      int32_t id = int32_t(rng() % uint64_t(c.p0 + c.n_local + 3)) - 1;  // -1, others' ids, ours
      if (one_per_row && id >= c.p0 && id < c.p0 + c.n_local && served++ > 0) id = -1;
      phys[size_t(r * c.phys_stride + k)] = id;
    }
  }
  ExpertJobs j;
  j.x = x.data();
  j.x_stride = c.x_stride;
  j.phys = phys.data();
  j.phys_stride = c.phys_stride;
  j.rows = c.rows;
  j.K = c.K;
  j.compact = compact;
  j.one_per_row = one_per_row;
  std::vector<int32_t> row_base(size_t(c.rows) + 1, -7);
  j.row_base = compact ? row_base.data() : nullptr;

  // The reference: jobs in (row, slot) order, straight from the contract.
  const size_t out_rows = size_t(c.rows * c.K);
  std::vector<float> want(out_rows * size_t(c.H), -99.0f), got(want);
  std::vector<int32_t> want_base(size_t(c.rows) + 1);
  int64_t served = 0;
  for (int64_t r = 0; r < c.rows; r++) {
    want_base[size_t(r)] = int32_t(served);
    for (int k = 0; k < c.K; k++) {
      const int32_t id = phys[size_t(r * c.phys_stride + k)];
      if (id < c.p0 || id >= c.p0 + c.n_local) continue;
      const int64_t dst = compact ? served : one_per_row ? r : r * c.K + k;
      probe(id, &x[size_t(r * c.x_stride)], 1, c.H, &want[size_t(dst * c.H)]);
      served++;
    }
  }
  want_base[size_t(c.rows)] = int32_t(served);

  const int H = c.H;
  run_jobs_grouped(j, c.H, c.p0, c.n_local,
                   [H](int p, const float* in, int64_t n, float* out) { probe(p, in, n, H, out); }, got.data());
  ASSERT_EQ(got, want) << "rows " << c.rows << " K " << c.K << " compact " << compact << " one_per_row "
                       << one_per_row;
  if (compact) {
    EXPECT_EQ(row_base, want_base);
  }
}

TEST(CpuExpertJobs, MatchesTheContractOnEveryLayout) {
  const Case cases[] = {
      {0, 2, 8, 0, 4, 8, 2},       // no rows
      {1, 1, 3, 0, 1, 3, 1},       // one row, one slot
      {37, 4, 16, 4, 6, 16, 4},    // dense rows, a middle range of experts
      {50, 8, 33, 0, 16, 40, 11},  // records: rows and ids inside wider strides
      {200, 2, 64, 10, 3, 70, 9},  // few local experts, many rows each
  };
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    uint64_t seed = 1;
    for (const Case& c : cases)
      for (bool compact : {false, true})
        for (bool one : {false, true}) {
          if (compact && one) continue;  // two output layouts, not combined
          check(c, compact, one, seed++);
        }
  }
  set_num_threads(0);
}

TEST(CpuExpertJobs, ManyExpertsTakeTheParallelPathWithTheSameResult) {
  // Enough groups for one-thread-per-expert scheduling (>= 2 * threads, small groups).
  set_num_threads(2);
  check({64, 8, 32, 0, 64, 32, 8}, /*compact=*/true, false, 99);
  check({64, 8, 32, 0, 64, 32, 8}, /*compact=*/false, false, 100);
  set_num_threads(0);
}

}  // namespace
}  // namespace epmoe
