// The three collectives the checks use to turn each rank's tallies into one verdict, so that the
// CPU check (MPI MpiGroup) and the GPU check (NCCL group) share the summarising code.
#pragma once

#include <cstdint>
#include <functional>

#include "comm/mpi_group.h"

namespace epmoe {

struct GroupReduce {
  std::function<int64_t(int64_t)> sum_i64;
  std::function<double(double)> max_f64;  // of non-negative values
  std::function<double(double)> sum_f64;  // the same result on every rank
};

inline GroupReduce group_reduce(MpiGroup& comm) {
  return {[&comm](int64_t v) { return comm.allreduce_sum(v); },
          [&comm](double v) { return comm.allreduce_max_f64(v); },
          [&comm](double v) { return comm.allreduce_sum_f64(v); }};
}

}  // namespace epmoe
