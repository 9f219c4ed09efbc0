// Helpers shared by the fuzz targets.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace epmoe::fuzz {

// A property the parser promises was broken: report it and abort, so that libFuzzer saves the
// input as a crash. (A plain `assert` would vanish under NDEBUG.)
#define FUZZ_REQUIRE(cond, what)                                                          \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "fuzz invariant failed: %s (%s) at %s:%d\n", what, #cond,      \
                   __FILE__, __LINE__);                                                   \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

// Writes the input to one file per process (the readers under test take paths). /dev/shm keeps
// it in memory, so a run costs microseconds, not a disk write.
inline std::string write_input_file(const uint8_t* data, size_t size, const char* suffix) {
  static const std::string dir = [] {
    const char* shm = "/dev/shm";
    return access(shm, W_OK) == 0 ? std::string(shm) : std::string("/tmp");
  }();
  const std::string path = dir + "/epmoe-fuzz-" + std::to_string(getpid()) + suffix;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  if (!f) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

}  // namespace epmoe::fuzz
