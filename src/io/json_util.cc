#include "io/json_util.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
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

// ---- fp32-exact JSON (log-probs): the shortest decimal of each float ----

nlohmann::json json_fp32(float v) { return std::isfinite(v) ? nlohmann::json(double(v)) : nlohmann::json(nullptr); }

namespace {

// Significant digits of a decimal (leading and trailing zeros of the digit string dropped).
size_t significant_digits(const std::string& t) {
  std::string d;
  for (char c : t.substr(0, t.find('e')))
    if (c >= '0' && c <= '9') d += c;
  const size_t a = d.find_first_not_of('0');
  return a == std::string::npos ? 1 : d.find_last_not_of('0') - a + 1;
}

// The shortest round-trip text of v: std::to_chars picks the fewest *characters*, which for a
// large integral value is the fixed form with more digits ("3149415841792" for 3.1494158e+12);
// the scientific form always has the fewest digits, so it is taken when it has fewer.
template <typename T>
std::string shortest_text(T v) {
  char a[64], b[64];
  const auto ra = std::to_chars(a, a + sizeof a, v);
  const auto rb = std::to_chars(b, b + sizeof b, v, std::chars_format::scientific);
  std::string t(a, ra.ptr);
  std::string sci(b, rb.ptr);
  if (significant_digits(sci) < significant_digits(t)) t = sci;
  if (t.find_first_of(".e") == std::string::npos) t += ".0";
  return t;
}

}  // namespace

std::string fp32_text(float v) { return std::isfinite(v) ? shortest_text(v) : "null"; }

namespace {

std::string double_text(double d) {
  if (!std::isfinite(d)) return "null";
  const float f = float(d);
  if (double(f) == d) return fp32_text(f);
  return shortest_text(d);
}

void write_json(const nlohmann::json& j, std::string& out) {
  switch (j.type()) {
    case nlohmann::json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) out += ',';
        first = false;
        out += nlohmann::json(it.key()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        out += ':';
        write_json(it.value(), out);
      }
      out += '}';
      break;
    }
    case nlohmann::json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < j.size(); i++) {
        if (i) out += ',';
        write_json(j[i], out);
      }
      out += ']';
      break;
    }
    case nlohmann::json::value_t::number_float:
      out += double_text(j.get<double>());
      break;
    default:
      out += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
}

}  // namespace

std::string dump_json(const nlohmann::json& j) {
  std::string out;
  write_json(j, out);
  return out;
}

}  // namespace epmoe
