// A safetensors file taken apart (8-byte length, JSON header, data) so that a test can break one
// thing in it and write it back: a dtype, a shape, offsets, the length itself, a value.
#pragma once

#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "common/scratch.h"
#include "tensor/dtype.h"

namespace epmoe::test {

struct RawSafetensors {
  nlohmann::json header;
  std::string data;

  static RawSafetensors read(const std::string& path) {
    const std::string bytes = read_file(path);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    RawSafetensors r;
    r.header = nlohmann::json::parse(bytes.substr(8, n));
    r.data = bytes.substr(8 + n);
    return r;
  }

  // Writes the file; `header_text` replaces the JSON (for headers nlohmann cannot express, such
  // as a duplicate key), `length` the 8-byte length. The header is padded with spaces to keep
  // the data 8-byte aligned, as the safetensors library does, unless `pad` is false.
  void write(const std::string& path, const std::string& header_text = "", int64_t length = -1,
             bool pad = true) const {
    std::string h = header_text.empty() ? header.dump() : header_text;
    while (pad && (8 + h.size()) % 8) h.push_back(' ');
    const uint64_t n = length >= 0 ? uint64_t(length) : h.size();
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &n, 8);
    write_file(path, bytes + h + data);
  }

  nlohmann::json& entry(const std::string& name) {
    if (!header.contains(name)) throw std::runtime_error("no tensor " + name);
    return header[name];
  }

  // Overwrites element i of an F32 or BF16 tensor with `value` (NaN and Inf included).
  void set_value(const std::string& name, int64_t i, float value) {
    const nlohmann::json& e = entry(name);
    const size_t begin = e["data_offsets"][0].get<size_t>();
    const std::string dtype = e["dtype"].get<std::string>();
    if (dtype == "F32") {
      std::memcpy(&data[begin + 4 * size_t(i)], &value, 4);
    } else if (dtype == "BF16") {
      const uint16_t b = f32_to_bf16(value);
      std::memcpy(&data[begin + 2 * size_t(i)], &b, 2);
    } else {
      throw std::runtime_error("set_value: unsupported dtype " + dtype);
    }
  }
};

}  // namespace epmoe::test
