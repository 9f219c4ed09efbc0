#include "io/json_util.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fstream>
#include <map>
#include <sstream>
#include <sys/stat.h>

#include "util/error.h"

namespace epmoe {

using nlohmann::json;

json parse_json_text(const std::string& file, const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw InputError(file + ": invalid JSON: " + e.what());
  }
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(path + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json read_json_file(const std::string& path) { return parse_json_text(path, read_text_file(path)); }

namespace {

struct DupFinder : nlohmann::json_sax<json> {
  std::string nested;
  int depth = 0;
  bool in_nested = false;
  std::string last_top_key;
  std::map<std::string, int> seen;
  std::string duplicate;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    depth++;
    if (depth == 2 && !nested.empty() && last_top_key == nested) in_nested = true;
    return true;
  }
  bool key(string_t& k) override {
    if (depth == 1) last_top_key = k;
    bool count = nested.empty() ? depth == 1 : (in_nested && depth == 2);
    if (count && ++seen[k] == 2 && duplicate.empty()) duplicate = k;
    return true;
  }
  bool end_object() override {
    if (depth == 2) in_nested = false;
    depth--;
    return true;
  }
  bool start_array(std::size_t) override { depth++; return true; }
  bool end_array() override { depth--; return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
};

}  // namespace

std::string find_duplicate_key(const std::string& text, const std::string& nested_key) {
  DupFinder f;
  f.nested = nested_key;
  json::sax_parse(text, &f, nlohmann::detail::input_format_t::json, false);
  return f.duplicate;
}

nlohmann::json json_float(float v) {
  if (!std::isfinite(v)) return nullptr;
  char buf[32];
  for (int digits = 1; digits <= 9; digits++) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, double(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return std::strtod(buf, nullptr);
}

}  // namespace epmoe
