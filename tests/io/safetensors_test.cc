// The safetensors reader on valid files and on every kind of malformed file: each must give an
// InputError that names the file and what is wrong, never a crash.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/golden.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "util/error.h"

namespace epmoe {
namespace {

std::string tmp_path(const std::string& name) {
  return ::testing::TempDir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" + name;
}

// Writes raw bytes: 8-byte length (given or the true one), header text, then data bytes.
std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes,
                      int64_t length_override = -1) {
  std::string path = tmp_path(name);
  std::ofstream f(path, std::ios::binary);
  uint64_t n = length_override >= 0 ? uint64_t(length_override) : header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(header.data(), std::streamsize(header.size()));
  std::string data(data_bytes, '\0');
  f.write(data.data(), std::streamsize(data.size()));
  return path;
}

// Expects InputError whose message contains every fragment.
void expect_input_error(const std::string& path, std::vector<std::string> fragments) {
  try {
    SafetensorsFile f(path);
    FAIL() << "no error for " << path;
  } catch (const InputError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (auto& frag : fragments) EXPECT_NE(msg.find(frag), std::string::npos) << "missing '" << frag << "' in: " << msg;
  }
}

TEST(Safetensors, ReadsWrittenFileInPlace) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b = {f32_to_bf16(1.5f), f32_to_bf16(-2.0f)};
  std::string path = tmp_path("ok.safetensors");
  write_safetensors(path, {{"a", DType::F32, {2, 3}, a.data()}, {"b", DType::BF16, {2}, b.data()}});
  SafetensorsFile f(path);
  TensorView va = f.get("a"), vb = f.get("b");
  EXPECT_EQ(va.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(va.at(5), 6.0f);
  EXPECT_EQ(vb.dtype, DType::BF16);
  EXPECT_EQ(vb.at(0), 1.5f);
  EXPECT_EQ(vb.at(1), -2.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(va.data) % 4, 0u);  // in place, aligned as written
  EXPECT_THROW(f.get("missing"), InputError);
}

TEST(Safetensors, TruncatedBeforeLength) {
  std::string path = tmp_path("short");
  std::ofstream(path, std::ios::binary) << "abc";
  expect_input_error(path, {"shorter than the 8-byte header length"});
}

TEST(Safetensors, HeaderLengthBeyondFile) {
  expect_input_error(write_raw("beyond", "{}", 0, 1000), {"runs past the end of the file"});
}

TEST(Safetensors, HeaderLengthAbove100MB) {
  expect_input_error(write_raw("huge", "{}", 0, int64_t(200) << 20), {"exceeds the 100 MB limit"});
}

TEST(Safetensors, HeaderNotJson) {
  expect_input_error(write_raw("badjson", "{\"a\": [1, 2", 0), {"not valid JSON"});
}

TEST(Safetensors, HeaderNotObject) { expect_input_error(write_raw("array", "[1, 2, 3]", 0), {"not an object"}); }

TEST(Safetensors, UnknownDtype) {
  expect_input_error(write_raw("dtype", R"({"w": {"dtype": "F7", "shape": [1], "data_offsets": [0, 4]}})", 4),
                     {"'w'", "unknown dtype 'F7'"});
}

TEST(Safetensors, ShapeSizeMismatch) {
  expect_input_error(write_raw("size", R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 20),
                     {"'w'", "24 bytes", "span 20"});
}

TEST(Safetensors, OffsetsBeyondData) {
  expect_input_error(write_raw("range", R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8),
                     {"'w'", "beyond the data section"});
}

TEST(Safetensors, OffsetsOutOfOrder) {
  expect_input_error(write_raw("order", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8),
                     {"'w'", "before begin"});
}

TEST(Safetensors, OffsetsOverlap) {
  expect_input_error(write_raw("overlap",
                               R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                               12),
                     {"'a'", "'b'", "overlap"});
}

// An empty tensor sorts between two overlapping ones; it must not hide their overlap.
TEST(Safetensors, OverlapBesideAnEmptyTensor) {
  expect_input_error(write_raw("overlap_empty",
                               R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                   "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                                   "c": {"dtype": "F32", "shape": [1], "data_offsets": [6, 10]}})",
                               10),
                     {"'a'", "'c'", "overlap"});
}

TEST(Safetensors, DuplicateNames) {
  expect_input_error(write_raw("dup",
                               R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                   "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                               8),
                     {"'a'", "listed twice"});
}

TEST(Safetensors, NegativeOrHugeShape) {
  expect_input_error(write_raw("neg", R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
                     {"'w'", "non-negative"});
  expect_input_error(
      write_raw("ovf", R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 4]}})", 4),
      {"'w'", "too large"});
}

TEST(Safetensors, MissingFields) {
  expect_input_error(write_raw("nooff", R"({"w": {"dtype": "F32", "shape": [1]}})", 4), {"'w'", "data_offsets"});
}

TEST(Checkpoint, MissingTensorNamesTensorAndFiles) {
  Checkpoint ck(test::fixture("qwen3moe-tiny-mixed-bf16"));
  try {
    ck.get("model.layers.9.mlp.gate.weight");
    FAIL();
  } catch (const InputError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("model.layers.9.mlp.gate.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("model-00001-of-00002.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("model-00002-of-00002.safetensors"), std::string::npos) << m;
  }
}

// Shards open on first use: a rank that needs nothing from a missing shard never notices it,
// and the first lookup into it names the shard.
TEST(Checkpoint, OpensShardsOnFirstUse) {
  const std::string dir = tmp_path("lazy");
  std::filesystem::create_directories(dir);
  const std::string src = test::fixture("qwen3moe-tiny-mixed-bf16");
  for (const char* f : {"config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors"})
    std::filesystem::copy_file(src + "/" + f, dir + "/" + f, std::filesystem::copy_options::overwrite_existing);
  auto index = nlohmann::json::parse(std::ifstream(dir + "/model.safetensors.index.json"));
  std::string in1, in2;
  for (auto& [name, shard] : index["weight_map"].items())
    (shard == "model-00001-of-00002.safetensors" ? in1 : in2) = name;
  Checkpoint ck(dir);
  EXPECT_TRUE(ck.contains(in2));
  EXPECT_EQ(ck.files().size(), 2u);
  EXPECT_EQ(ck.file_of(in2), dir + "/model-00002-of-00002.safetensors");
  EXPECT_NO_THROW(ck.get(in1));
  try {
    ck.get(in2);
    FAIL() << "no error for a tensor of the missing shard";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("shard 'model-00002-of-00002.safetensors'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("is missing"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, ShardedLookupFindsEveryIndexedTensor) {
  const std::string dir = test::fixture("qwen3moe-tiny-mixed-bf16");
  Checkpoint ck(dir);
  auto index = nlohmann::json::parse(std::ifstream(dir + "/model.safetensors.index.json"));
  size_t n = 0;
  for (auto& [name, shard] : index["weight_map"].items()) {
    EXPECT_TRUE(ck.contains(name));
    n++;
  }
  EXPECT_EQ(ck.names().size(), n);
  EXPECT_EQ(ck.files().size(), 2u);
}

}  // namespace
}  // namespace epmoe
