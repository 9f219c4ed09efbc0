// A step buffer: grown to the largest size asked for and then reused, never zeroed (every user
// writes before it reads). A forward step holds its activations in these so that the steady state
// allocates nothing: a fresh std::vector per step is a memset at least, and above glibc's mmap
// limit (32 MB: q and the attention context of a 2048-token prefill) page faults and the kernel's
// page zeroing as well (docs/cpu-profile.md).
#pragma once

#include <cstddef>
#include <memory>

namespace epmoe {

template <class T>
class Scratch {
 public:
  T* get(size_t n) {
    if (n > cap_) {
      p_.reset(new T[n]);  // default-initialised: no zeroing
      cap_ = n;
    }
    return p_.get();
  }

 private:
  std::unique_ptr<T[]> p_;
  size_t cap_ = 0;
};

}  // namespace epmoe
