#include "util/token_ids.h"

#include <cctype>
#include <climits>

#include "util/error.h"

namespace epmoe {

std::vector<int32_t> parse_ids(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) i++;
    size_t j = i;
    if (j < text.size() && text[j] == '-') j++;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) j++;
    if (j == i || (j == i + 1 && text[i] == '-'))
      throw InputError(what + ": expected comma-separated token ids, got '" + text + "'");
    long long v = std::stoll(text.substr(i, j - i));
    if (v < INT32_MIN || v > INT32_MAX) throw InputError(what + ": id " + text.substr(i, j - i) + " out of range");
    ids.push_back(int32_t(v));
    while (j < text.size() && (text[j] == ' ' || text[j] == '\t')) j++;
    if (j < text.size() && text[j] != ',') throw InputError(what + ": expected ',' after id " + std::to_string(v));
    i = j + 1;
    if (j < text.size() && i >= text.size()) throw InputError(what + ": trailing ','");
  }
  return ids;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); i++) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

}  // namespace epmoe
