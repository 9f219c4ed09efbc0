// safetensors reader. Format: u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the data. Offsets are relative to the start of the data.
//
// Everything in the header is validated before a single tensor is handed out: the length is
// bounded, the JSON is an object, dtypes are known, shape x dtype size equals the byte range,
// ranges lie inside the data and do not overlap. A malformed file is an InputError naming the
// file and the tensor, never a crash.
//
// Tensors are used in place from the map. The safetensors library aligns every tensor to its
// dtype (header padded to 8 bytes, data sorted by dtype); a file written without that padding is
// still read, but its misaligned tensors are copied once, on first get(), to aligned memory --
// reading a bf16 or f32 through a misaligned pointer is undefined behaviour.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "tensor/view.h"

namespace epmoe {

struct SafetensorsEntry {
  DType dtype;
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // relative to the data section
};

// Parses and validates a header (the JSON bytes) against a data section of data_size bytes.
// Separate from the file so that fuzzers and tests can drive it on bytes in memory.
std::map<std::string, SafetensorsEntry> parse_safetensors_header(const std::string& file,
                                                                  const char* json, size_t len,
                                                                  size_t data_size);

inline constexpr size_t kMaxSafetensorsHeader = 100u << 20;  // 100 MB, as the reference reader

// A whole safetensors file's bytes (mapped, or received: serve's weight updates): the length
// prefix bounded, no tensor listed twice, the header validated as above. `data_offset`: where the
// data section starts in `bytes`. `file` names the bytes in errors.
struct SafetensorsLayout {
  std::map<std::string, SafetensorsEntry> entries;
  size_t data_offset = 0;
};
SafetensorsLayout parse_safetensors_bytes(const std::string& file, const unsigned char* bytes, size_t size);

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  TensorView get(const std::string& name) const;  // throws InputError when absent
  std::vector<std::string> names() const;
  const std::string& path() const { return map_->path(); }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  // __metadata__ string entries (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  const void* aligned_copy(const std::string& name, const unsigned char* bytes, size_t n) const;

  std::shared_ptr<MappedFile> map_;
  const unsigned char* data_ = nullptr;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  struct AlignedCopies;  // of misaligned tensors, made on first use and kept with the file
  std::shared_ptr<AlignedCopies> aligned_;
};

// A tensor's place in a file being written: name, dtype, shape (its data follows the header in
// the order given).
struct TensorLayout {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  size_t bytes() const;
};
// The bytes a safetensors file starts with, the one writer of the format (write_safetensors and
// synth's parallel shard writer): the header's length (8 bytes, little-endian) and the JSON header
// -- each tensor's dtype, shape and data offsets in the order given, `metadata` as __metadata__
// when not empty -- padded with spaces so that the data starts 8-byte aligned.
std::string safetensors_prefix(const std::vector<TensorLayout>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

// Writes tensors (fp32 or raw bytes with dtype) as a safetensors file; used by `score` and tests.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
};
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace epmoe
