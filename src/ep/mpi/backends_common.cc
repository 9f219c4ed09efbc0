#include "ep/mpi/backends_impl.h"

namespace epmoe {

size_t total_bytes(const std::vector<size_t>& b) {
  size_t t = 0;
  for (size_t x : b) t += x;
  return t;
}

std::vector<const float*> split_by_rank(const float* base, const std::vector<size_t>& bytes) {
  std::vector<const float*> out;
  const char* p = reinterpret_cast<const char*>(base);
  for (size_t b : bytes) {
    out.push_back(reinterpret_cast<const float*>(p));
    p += b;
  }
  return out;
}

void serve_by_source(const char* records, const std::vector<int64_t>& records_from, const DispatchRecordLayout& L,
                     ExpertRunner& experts, CombineMode mode, Answers& a) {
  size_t n = 0;
  for (int64_t c : records_from) n += size_t(c);
  a.bytes_to.clear();
  a.rows.resize(count_answers(records, n, L, mode) * size_t(L.H));
  serve_records(records, n, L, experts, mode, a.rows.data());
  const char* r = records;
  for (int64_t c : records_from) {
    a.bytes_to.push_back(count_answers(r, size_t(c), L, mode) * L.answer_bytes());
    r += size_t(c) * L.bytes();
  }
}

}  // namespace epmoe
