#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>

#include "util/error.h"

namespace epmoe {

struct Regex::Code {
  pcre2_code* code = nullptr;
  std::string pattern;  // for error messages
  ~Code() { pcre2_code_free(code); }
};

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// Oniguruma (Ruby syntax, as tokenizers uses it) and PCRE2 differ on \s under Unicode: for
// Oniguruma it is the White_Space property, for PCRE2 with UCP it is \p{Z} plus \h and \v, which
// also takes U+180E MONGOLIAN VOWEL SEPARATOR. Spelling the property out keeps the two engines
// in agreement without any code point table. Escaped backslashes are copied untouched.
std::string oniguruma_to_pcre2(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c != '\\' || i + 1 == pattern.size()) {
      out.push_back(c);
      continue;
    }
    const char e = pattern[++i];
    if (e == 's') {
      out += "\\p{White_Space}";
    } else if (e == 'S') {
      out += "\\P{White_Space}";
    } else {
      out.push_back('\\');
      out.push_back(e);
    }
  }
  return out;
}

// Per-thread match state: match data and a JIT stack large enough for long runs of one class
// (a megabyte of spaces), so that concurrent encode() calls never share mutable PCRE2 state.
struct MatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchState() { pcre2_jit_stack_assign(context, nullptr, jit_stack); }
  ~MatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

Regex Regex::compile(std::string_view pattern, const std::string& source) {
  const std::string translated = oniguruma_to_pcre2(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  // MULTILINE: in Oniguruma's Ruby syntax ^ and $ are line anchors.
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, nullptr);
  if (!code) {
    throw InputError(source + ": regex '" + std::string(pattern) + "' does not compile: " +
                     pcre2_message(error) + " (at offset " + std::to_string(offset) + ")");
  }
  // JIT is several times faster; without it (unsupported CPU) the interpreter still works.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  auto c = std::make_shared<Code>();
  c->code = code;
  c->pattern = std::string(pattern);
  Regex r;
  r.code_ = std::move(c);
  return r;
}

Regex Regex::literal(std::string_view literal, const std::string& source) {
  // Backslash-escaping every ASCII punctuation character makes it literal in both syntaxes.
  std::string pattern;
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) pattern.push_back('\\');
    pattern.push_back(c);
  }
  return compile(pattern, source);
}

void Regex::find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const {
  MatchState& st = match_state();
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t start = 0;
  while (start < subject.size()) {
    int rc =
        pcre2_match(code_->code, s, subject.size(), start, PCRE2_NO_UTF_CHECK, st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      throw Error("pre-tokenizer regex '" + code_->pattern + "' failed: " + pcre2_message(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      start = e;
    } else {
      // An empty match yields no piece; step over one whole character and search on.
      start = b + 1;
      while (start < subject.size() && (static_cast<unsigned char>(subject[start]) & 0xC0) == 0x80)
        ++start;
    }
  }
}

bool Regex::full_match(std::string_view subject) const {
  MatchState& st = match_state();
  int rc =
      pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0,
                  PCRE2_ANCHORED | PCRE2_ENDANCHORED | PCRE2_NO_UTF_CHECK, st.data, st.context);
  return rc >= 0;
}

}  // namespace epmoe
