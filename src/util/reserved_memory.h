// A large zero-filled region reserved from the OS without committing it (mmap, MAP_NORESERVE):
// pages arrive when first written. For pools sized to a share of the machine (the CPU's KV
// cache): a pool of gigabytes costs address space until it is used -- and, unlike a heap
// allocation, nothing (a sanitizer's bookkeeping included) walks it up front.
#pragma once

#include <cstddef>

namespace epmoe {

class ReservedMemory {
 public:
  ReservedMemory() = default;
  explicit ReservedMemory(size_t bytes);  // Error when the OS refuses the reservation
  ~ReservedMemory();
  ReservedMemory(ReservedMemory&& o) noexcept;
  ReservedMemory& operator=(ReservedMemory&& o) noexcept;
  ReservedMemory(const ReservedMemory&) = delete;
  ReservedMemory& operator=(const ReservedMemory&) = delete;

  void* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace epmoe
