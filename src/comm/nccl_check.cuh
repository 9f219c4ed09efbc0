// NCCL error checks that throw epmoe::Error with file:line (the NCCL group and backends).
#pragma once

#include <nccl.h>

#include <string>

#include "util/error.h"

#define EPMOE_NCCL_CHECK(x)                                                                                 \
  do {                                                                                                      \
    ncclResult_t r_ = (x);                                                                                  \
    if (r_ != ncclSuccess)                                                                                  \
      throw ::epmoe::Error(std::string("NCCL error at ") + __FILE__ + ":" + std::to_string(__LINE__) + ": " + \
                           #x + ": " + ncclGetErrorString(r_));                                             \
  } while (0)
