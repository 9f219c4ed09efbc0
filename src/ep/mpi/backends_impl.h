// Internals shared by the MPI backends (src/ep/mpi/*.cc). Not for other layers.
#pragma once

#include <memory>
#include <vector>

#include "comm/mpi_group.h"
#include "ep/backend.h"
#include "ep/mpi/exchange.h"
#include "ep/mpi/mpi_backends.h"

namespace epmoe {

// Buffers of one exchange, kept by a backend across layers (grow-only: fresh pages are costly).
struct ExchangeBuffers {
  std::vector<char> send, recv;
  std::vector<float> back;
};

// Answers to records received from each source rank (records packed in rank order).
struct Answers {
  std::vector<float> rows;       // all answers, in record order
  std::vector<size_t> bytes_to;  // answer bytes going back to each source rank
};
void serve_by_source(const char* records, const std::vector<int64_t>& records_from, const DispatchRecordLayout& L,
                     ExpertRunner& experts, CombineMode mode, Answers& out);

size_t total_bytes(const std::vector<size_t>& b);
// Pointers to each rank's part of a buffer packed in rank order.
std::vector<const float*> split_by_rank(const float* base, const std::vector<size_t>& bytes);

// Dedup dispatch + combine of tokens [t0, t1) with blocking collectives (alltoall backend; also
// the body of every round of the others' simplest paths).
void exchange_dedup_blocking(MpiGroup& comm, const Placement& p, const MoeTokens& in, ExpertRunner& experts,
                             const BackendOptions& opt, int64_t t0, int64_t t1, ExchangeBuffers& buf, float* y);


}  // namespace epmoe
