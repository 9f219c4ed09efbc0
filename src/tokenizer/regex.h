// Pre-tokenisation regexes through PCRE2.
//
// Hugging Face tokenizers runs the patterns of tokenizer.json with Oniguruma; PCRE2 with
// PCRE2_UTF | PCRE2_UCP gives the same Unicode classes (\p{L}, \p{N}, caseless contractions,
// lookahead) once the few syntax differences are bridged (see regex.cc).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace epmoe {

class Regex {
 public:
  Regex() = default;

  // Compiles an Oniguruma-syntax pattern as written in tokenizer.json. `source` names where it
  // came from (file and field); a pattern PCRE2 rejects is an InputError naming it.
  static Regex compile(std::string_view pattern, const std::string& source);

  // A regex matching `literal` exactly (the {"String": ...} form of a Split pattern).
  static Regex literal(std::string_view literal, const std::string& source);

  // Appends the [begin, end) byte ranges of the non-empty, non-overlapping matches in
  // `subject`, left to right. `subject` must be well-formed UTF-8 (callers sanitise input
  // first), which lets PCRE2 skip its per-call validity scan.
  void find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const;

  // Whether the whole of `subject` matches (used for single-character class tests).
  bool full_match(std::string_view subject) const;

  bool empty() const { return !code_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;  // compiled code is immutable, shared by copies
};

}  // namespace epmoe
