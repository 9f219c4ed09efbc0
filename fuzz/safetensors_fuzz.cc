// Fuzzes the safetensors reader (src/io/safetensors.h) with whole files: the 8-byte header length,
// the JSON header and the data. Two paths:
//   1. parse_safetensors_header() on the header bytes copied to a buffer of exactly their size
//      (ASan then catches any read past them), checking every promise the parser makes about
//      the entries it accepts;
//   2. SafetensorsFile on the same bytes written to a file (length checks, duplicate names,
//      metadata, get()).
// The only exception allowed out of either is InputError; anything else is a finding.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_util.h"
#include "io/safetensors.h"
#include "util/error.h"

using namespace epmoe;

namespace {

void check_entries(const std::map<std::string, SafetensorsEntry>& entries, size_t data_size) {
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const auto& [name, e] : entries) {
    FUZZ_REQUIRE(e.begin <= e.end && e.end <= data_size, "accepted range lies inside the data");
    unsigned __int128 n = dtype_size(e.dtype);
    for (int64_t d : e.shape) {
      FUZZ_REQUIRE(d >= 0, "dimensions are non-negative");
      n *= uint64_t(d);
    }
    FUZZ_REQUIRE(n == e.end - e.begin, "shape x dtype size equals the byte range");
    if (e.end > e.begin) ranges.push_back({e.begin, e.end});
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); i++)
    FUZZ_REQUIRE(ranges[i].first >= ranges[i - 1].second, "accepted ranges do not overlap");
}

void parse_in_memory(const uint8_t* data, size_t size) {
  if (size < 8) return;
  uint64_t n;
  std::memcpy(&n, data, 8);
  n = std::min<uint64_t>(n, size - 8);
  // An exact-size heap copy: the parser must stay within [text, text + n).
  std::unique_ptr<char[]> text(new char[n ? n : 1]);
  std::memcpy(text.get(), data + 8, n);
  const size_t data_size = size - 8 - n;
  try {
    check_entries(parse_safetensors_header("fuzz.safetensors", text.get(), n, data_size), data_size);
  } catch (const InputError&) {
  }
}

void open_as_file(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_input_file(data, size, ".safetensors");
  try {
    SafetensorsFile f(path);
    uint64_t header = 0;
    std::memcpy(&header, data, 8);  // the file opened, so it has the 8 bytes and the header
    const size_t data_size = size - 8 - header;
    check_entries(f.entries(), data_size);
    const auto* base = data + 8 + header;
    for (const auto& name : f.names()) {
      TensorView v = f.get(name);
      // The view points at the entry's bytes in the map, so they equal the input's bytes there.
      const auto& e = f.entries().at(name);
      FUZZ_REQUIRE(v.nbytes() == e.end - e.begin, "view covers exactly the entry");
      FUZZ_REQUIRE(std::memcmp(v.data, base + e.begin, v.nbytes()) == 0, "view reads the entry's bytes");
    }
    for (const auto& [k, val] : f.metadata()) (void)k, (void)val;
  } catch (const InputError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  parse_in_memory(data, size);
  open_as_file(data, size);
  return 0;
}
