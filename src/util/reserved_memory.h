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

// Keeps the buffers of a forward step in the heap, and the heap itself: call once at process
// start (the CLI and the benchmarks do). A step allocates and frees buffers of hundreds of KB to
// tens of MB (activations, scores, logits); above glibc's default mmap threshold each came from a
// fresh mmap and went back to the kernel at free, so every step paid the page faults and the
// kernel's zeroing of those pages again: ~10 % of a 512-token prefill on 2 cores
// (docs/cpu-profile.md). With this, a process holds its peak step's memory, as a server should.
// (Larger blocks -- the KV pool, weights copied off the mapping -- still get their own mmap.)
void keep_step_buffers_in_heap();

}  // namespace epmoe
