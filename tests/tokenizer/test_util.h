// Shared helpers of the tokenizer tests: fixture paths, case files, scratch folders.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace epmoe::test {

inline std::string data_path(const std::string& rel) {
  return std::string(EPMOE_TEST_DATA) + "/" + rel;
}

inline std::string qwen2_dir() { return data_path("tokenizers/qwen2"); }
inline std::string bpe_fixture_dir() { return data_path("bpe-tokenizer"); }

struct Case {
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded;
};

// Reads a case file: either {"cases": [...]} or a bare array of {text, ids, decoded}.
inline std::vector<Case> read_cases(const std::string& path) {
  std::ifstream f(path);
  nlohmann::json j = nlohmann::json::parse(f);
  const nlohmann::json& list = j.is_object() ? j.at("cases") : j;
  std::vector<Case> cases;
  for (const auto& c : list) {
    cases.push_back({c.at("text").get<std::string>(), c.at("ids").get<std::vector<int32_t>>(),
                     c.at("decoded").get<std::string>()});
  }
  return cases;
}

// A fresh folder under the system temp dir, removed with the object.
class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("epmoe_tokenizer_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::string path() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string write(const std::string& name, const std::string& content) const {
    std::ofstream(file(name), std::ios::binary) << content;
    return file(name);
  }

 private:
  std::filesystem::path path_;
};

}  // namespace epmoe::test
