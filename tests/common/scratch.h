// Scratch copies of fixtures for tests that break one thing in a model folder: a writable copy in a
// fresh temporary folder (removed at the end of the test), and small file helpers.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/golden.h"

namespace epmoe::test {

namespace fs = std::filesystem;

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

// A fresh folder named after the running test (so that a failure message points at it), holding
// a writable copy of a fixture or nothing. Removed when the test ends.
class Scratch {
 public:
  explicit Scratch(const std::string& fixture_name = "") {
    std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (auto& c : test)
      if (c == '/') c = '_';
    dir_ = fs::path(::testing::TempDir()) / ("epmoe-" + test + "-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    if (!fixture_name.empty()) {
      for (const auto& e : fs::directory_iterator(fixture(fixture_name))) {
        const fs::path to = dir_ / e.path().filename();
        fs::copy_file(e.path(), to);
        // The fixtures are read-only in the repository; the copy must be writable.
        fs::permissions(to, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
      }
    }
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  std::string dir() const { return dir_.string(); }
  std::string path(const std::string& file) const { return (dir_ / file).string(); }

  nlohmann::json json(const std::string& file) const { return nlohmann::json::parse(read_file(path(file))); }
  void set_json(const std::string& file, const nlohmann::json& j) const { write_file(path(file), j.dump(2)); }
  std::string text(const std::string& file) const { return read_file(path(file)); }
  void set_text(const std::string& file, const std::string& t) const { write_file(path(file), t); }
  void remove(const std::string& file) const { fs::remove(path(file)); }

 private:
  fs::path dir_;
};

}  // namespace epmoe::test
