// A small persistent thread pool. Work is split into contiguous index ranges; each output element
// is written by exactly one task and its arithmetic never depends on the split, so results are
// bit-identical for every thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace epmoe {

// Sets the number of worker threads (including the caller). 0 = one per available core.
void set_num_threads(int n);
int num_threads();

// Calls fn(begin, end) on disjoint ranges covering [0, n), in parallel when n >= min_per_task * 2.
void parallel_for(int64_t n, int64_t min_per_task, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace epmoe
