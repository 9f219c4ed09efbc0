#include "util/reserved_memory.h"

#include <malloc.h>
#include <sys/mman.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <string>
#include <utility>

#include "util/error.h"

namespace epmoe {

ReservedMemory::ReservedMemory(size_t bytes) : n_(bytes) {
  if (bytes == 0) return;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw Error("cannot reserve " + std::to_string(bytes >> 20) + " MiB of memory: " + std::strerror(errno));
  p_ = p;
}

ReservedMemory::~ReservedMemory() {
  if (p_) munmap(p_, n_);
}

ReservedMemory::ReservedMemory(ReservedMemory&& o) noexcept
    : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}

ReservedMemory& ReservedMemory::operator=(ReservedMemory&& o) noexcept {
  if (this != &o) {
    if (p_) munmap(p_, n_);
    p_ = std::exchange(o.p_, nullptr);
    n_ = std::exchange(o.n_, 0);
  }
  return *this;
}

void keep_step_buffers_in_heap() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
}

}  // namespace epmoe
