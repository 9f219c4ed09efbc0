// The PCRE2 translation of tokenizer.json patterns keeps Oniguruma's meaning.
#include "tokenizer/regex.h"

#include <gtest/gtest.h>

#include "tokenizer/pretokenizer.h"

namespace epmoe {
namespace {

std::vector<std::string> matches(const Regex& r, std::string_view s) {
  std::vector<std::pair<size_t, size_t>> ranges;
  r.find_all(s, ranges);
  std::vector<std::string> out;
  for (auto [b, e] : ranges) out.emplace_back(s.substr(b, e - b));
  return out;
}

TEST(Regex, BackslashSIsUnicodeWhiteSpaceAsInOniguruma) {
  // Oniguruma's \s is the White_Space property; PCRE2's own \s would also take U+180E
  // MONGOLIAN VOWEL SEPARATOR (not White_Space since Unicode 6.3), which changes Qwen2 words.
  const Regex s = Regex::compile("\\s", "test");
  const Regex not_s = Regex::compile("\\S", "test");
  EXPECT_FALSE(s.full_match("\u180E"));
  EXPECT_TRUE(not_s.full_match("\u180E"));
  for (const char* ws : {" ", "\t", "\n", "\u0085", "\u00A0", "\u2028", "\u3000"}) {
    EXPECT_TRUE(s.full_match(ws)) << ws;
    EXPECT_FALSE(not_s.full_match(ws)) << ws;
  }
  // An escaped backslash followed by 's' is a literal backslash and a literal 's'.
  EXPECT_TRUE(Regex::compile("\\\\s", "test").full_match("\\s"));
}

TEST(Regex, Qwen2PatternKeepsMongolianVowelSeparatorOutOfWhitespaceRuns) {
  // With U+180E not a space, "\u180E\u180E" is one run of "other" characters; PCRE2's native \s
  // would instead split it off as whitespace and glue the second one to "y".
  const Regex qwen2 = Regex::compile(kQwen2Pattern, "test");
  EXPECT_EQ(matches(qwen2, "x\u180E\u180Ey"), (std::vector<std::string>{"x", "\u180E\u180E", "y"}));
}

TEST(Regex, LiteralPatternsMatchThemselves) {
  const Regex r = Regex::literal("a.b(c)", "test");
  EXPECT_EQ(matches(r, "xa.b(c)ya-b(c)"), (std::vector<std::string>{"a.b(c)"}));
}

TEST(Regex, EmptyMatchesAreSkipped) {
  const Regex r = Regex::compile("x*", "test");
  EXPECT_EQ(matches(r, "ab\u00E9xxc"), (std::vector<std::string>{"xx"}));
}

}  // namespace
}  // namespace epmoe
