#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>

#include "io/json_util.h"
#include "util/error.h"

namespace epmoe {

using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& file, const std::string& what) {
  throw InputError(file + ": invalid safetensors: " + what);
}

}  // namespace

std::map<std::string, SafetensorsEntry> parse_safetensors_header(const std::string& file,
                                                                  const char* text, size_t len,
                                                                  size_t data_size) {
  json header;
  try {
    header = json::parse(text, text + len);
  } catch (const json::exception& e) {
    bad(file, std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) bad(file, "header JSON is not an object");

  std::map<std::string, SafetensorsEntry> entries;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) bad(file, "__metadata__ is not an object");
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!info.is_object()) bad(file, where + ": entry is not an object");
    if (!info.contains("dtype") || !info["dtype"].is_string()) bad(file, where + ": missing dtype");
    if (!info.contains("shape") || !info["shape"].is_array()) bad(file, where + ": missing shape");
    if (!info.contains("data_offsets") || !info["data_offsets"].is_array() ||
        info["data_offsets"].size() != 2)
      bad(file, where + ": data_offsets must be [begin, end]");
    auto dt = dtype_from_name(info["dtype"].get<std::string>());
    if (!dt) bad(file, where + ": unknown dtype '" + info["dtype"].get<std::string>() + "'");

    SafetensorsEntry e;
    e.dtype = *dt;
    // Element count with overflow checks: a hostile shape must not wrap around to a small size.
    unsigned __int128 elems = 1;
    for (auto& d : info["shape"]) {
      if (!d.is_number_unsigned()) bad(file, where + ": shape entries must be non-negative integers");
      uint64_t v = d.get<uint64_t>();
      if (v > uint64_t(std::numeric_limits<int64_t>::max())) bad(file, where + ": dimension too large");
      e.shape.push_back(int64_t(v));
      elems *= v;
      if (elems > (unsigned __int128)(std::numeric_limits<uint64_t>::max())) bad(file, where + ": shape too large");
    }
    for (auto& o : info["data_offsets"])
      if (!o.is_number_unsigned()) bad(file, where + ": data_offsets must be non-negative integers");
    uint64_t b = info["data_offsets"][0].get<uint64_t>(), en = info["data_offsets"][1].get<uint64_t>();
    if (en < b) bad(file, where + ": data_offsets end " + std::to_string(en) + " before begin " + std::to_string(b));
    if (en > data_size)
      bad(file, where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(en) +
                    ") beyond the data section of " + std::to_string(data_size) + " bytes (truncated file?)");
    unsigned __int128 want = elems * dtype_size(e.dtype);
    if (want != (unsigned __int128)(en - b))
      bad(file, where + ": shape x dtype size is " + std::to_string(uint64_t(want)) +
                    " bytes but data_offsets span " + std::to_string(en - b));
    e.begin = size_t(b);
    e.end = size_t(en);
    entries.emplace(name, std::move(e));
  }

  // Ranges must not overlap (a tensor aliasing another is a corrupt or hostile file). Empty
  // tensors occupy no bytes and are left out: an empty one inside another's range used to sit
  // between two overlapping neighbours in the sorted order and hide them from the check of
  // adjacent pairs (found in review; fuzz/safetensors_fuzz.cc checks it). Among non-empty ranges
  // sorted by begin, the first overlap is always between neighbours.
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> sorted;
  for (auto& [n, e] : entries)
    if (e.end > e.begin) sorted.push_back({&n, &e});
  std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) {
    return a.second->begin != b.second->begin ? a.second->begin < b.second->begin
                                              : a.second->end < b.second->end;
  });
  for (size_t i = 1; i < sorted.size(); i++)
    if (sorted[i].second->begin < sorted[i - 1].second->end)
      bad(file, "tensors '" + *sorted[i - 1].first + "' and '" + *sorted[i].first + "' overlap");
  return entries;
}

SafetensorsFile::SafetensorsFile(const std::string& path)
    : map_(std::make_shared<MappedFile>(path)), aligned_(std::make_shared<AlignedCopies>()) {
  SafetensorsLayout layout = parse_safetensors_bytes(path, map_->data(), map_->size());
  data_ = map_->data() + layout.data_offset;
  entries_ = std::move(layout.entries);
  const char* text = reinterpret_cast<const char*>(map_->data() + 8);
  json header = json::parse(text, text + (layout.data_offset - 8));  // valid: parsed above
  if (header.contains("__metadata__"))
    for (auto& [k, v] : header["__metadata__"].items())
      if (v.is_string()) metadata_[k] = v.get<std::string>();
}

SafetensorsLayout parse_safetensors_bytes(const std::string& path, const unsigned char* bytes, size_t size) {
  if (size < 8) bad(path, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  uint64_t n;
  std::memcpy(&n, bytes, 8);  // little-endian on every platform we build for
  if (n > kMaxSafetensorsHeader)
    bad(path, "header length " + std::to_string(n) + " exceeds the 100 MB limit");
  if (n > size - 8)
    bad(path, "header length " + std::to_string(n) + " runs past the end of the file (" +
                  std::to_string(size) + " bytes; truncated download?)");
  const char* text = reinterpret_cast<const char*>(bytes + 8);
  // nlohmann keeps only the last of duplicate keys; a file naming one tensor twice is refused.
  std::string dup = find_duplicate_key(std::string(text, size_t(n)));
  if (!dup.empty()) bad(path, "tensor '" + dup + "' is listed twice in the header");
  SafetensorsLayout out;
  out.entries = parse_safetensors_header(path, text, size_t(n), size - 8 - size_t(n));
  out.data_offset = 8 + size_t(n);
  return out;
}

struct SafetensorsFile::AlignedCopies {
  std::mutex mutex;  // get() may be called from several threads
  std::map<std::string, std::unique_ptr<uint64_t[]>> copies;
};

const void* SafetensorsFile::aligned_copy(const std::string& name, const unsigned char* bytes, size_t n) const {
  std::lock_guard<std::mutex> lock(aligned_->mutex);
  auto& copy = aligned_->copies[name];
  if (!copy) {
    copy.reset(new uint64_t[(n + 7) / 8]);  // 8-byte aligned: enough for every dtype
    std::memcpy(copy.get(), bytes, n);
  }
  return copy.get();
}

TensorView SafetensorsFile::get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw InputError(path() + ": no tensor '" + name + "'");
  const SafetensorsEntry& e = it->second;
  TensorView v;
  v.dtype = e.dtype;
  v.shape = e.shape;
  v.data = data_ + e.begin;
  if (reinterpret_cast<uintptr_t>(v.data) % dtype_size(e.dtype) != 0)
    v.data = aligned_copy(name, data_ + e.begin, e.end - e.begin);
  v.name = name;
  return v;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (auto& [n, e] : entries_) out.push_back(n);
  return out;
}

size_t TensorLayout::bytes() const {
  size_t b = dtype_size(dtype);
  for (auto d : shape) b *= size_t(d);
  return b;
}

std::string safetensors_prefix(const std::vector<TensorLayout>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (auto& t : tensors) {
    const size_t bytes = t.bytes();
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8) h.push_back(' ');  // keep the data 8-byte aligned
  const uint64_t n = h.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + h;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorLayout> layout;
  for (auto& t : tensors) layout.push_back({t.name, t.dtype, t.shape});
  const std::string prefix = safetensors_prefix(layout, metadata);
  std::ofstream f(path, std::ios::binary);
  if (!f) throw InputError(path + ": cannot open for writing");
  f.write(prefix.data(), std::streamsize(prefix.size()));
  for (size_t i = 0; i < tensors.size(); i++)
    f.write(static_cast<const char*>(tensors[i].data), std::streamsize(layout[i].bytes()));
  if (!f) throw InputError(path + ": write failed");
}

}  // namespace epmoe
