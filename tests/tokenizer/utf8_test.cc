// UTF-8 repair against the examples of the Unicode Standard, chapter 3, "U+FFFD Substitution
// of Maximal Subparts" (Tables 3-8 to 3-11); Python's errors="replace" follows the same rule.
#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace epmoe {
namespace {

std::string fffd(int n) {
  std::string s;
  while (n-- > 0) s += utf8::kReplacement;
  return s;
}

TEST(Utf8, MaximalSubpartsBecomeOneReplacementEach) {
  // Table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64
  EXPECT_EQ(utf8::lossy("a\xF1\x80\x80\xE1\x80\xC2"
                        "b\x80"
                        "c\x80\xBF"
                        "d"),
            "a" + fffd(3) + "b" + fffd(1) + "c" + fffd(2) + "d");
  // Table 3-9 (non-shortest forms), 3-10 (surrogates), 3-11 (other ill-formed sequences):
  // every byte that cannot start or continue a well-formed sequence stands alone.
  EXPECT_EQ(utf8::lossy("\xC0\xAF\xE0\x80\xBF\xF0\x81\x82\x41"), fffd(8) + "A");
  EXPECT_EQ(utf8::lossy("\xED\xA0\x80\xED\xBF\xBF\xED\xAF\x41"), fffd(8) + "A");
  EXPECT_EQ(utf8::lossy("\xF4\x91\x92\x93\xFF\x41\x80\xBF\x42"), fffd(5) + "A" + fffd(2) + "B");
  EXPECT_EQ(utf8::lossy("\xE1\x80\xE2\xF0\x91\x92\xF1\xBF\x41"), fffd(4) + "A");
}

TEST(Utf8, WellFormedTextIsUnchanged) {
  const std::string s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80" + std::string(1, '\0') + "z";
  EXPECT_TRUE(utf8::is_valid(s));
  EXPECT_EQ(utf8::lossy(s), s);
}

TEST(Utf8, IncompleteTailIsOnlyAnUnfinishedCharacter) {
  EXPECT_EQ(utf8::incomplete_tail("ab"), 0u);
  EXPECT_EQ(utf8::incomplete_tail("a\xF0\x9F\x98"), 3u);  // 3 of the 4 bytes of an emoji
  EXPECT_EQ(utf8::incomplete_tail("a\xE2\x82"), 2u);
  EXPECT_EQ(utf8::incomplete_tail("a\xE0\x80"), 0u);  // E0 80 can never become well-formed
  EXPECT_EQ(utf8::incomplete_tail("a\x80"), 0u);      // a stray continuation byte
  EXPECT_EQ(utf8::incomplete_tail("\xF0\x9F\x98\x80"), 0u);
}

TEST(Utf8, NfcComposes) {
  EXPECT_EQ(utf8::nfc("e\xCC\x81"), "\xC3\xA9");                     // e + U+0301 -> é
  EXPECT_EQ(utf8::nfc("\xE1\x84\x92\xE1\x85\xA1"), "\xED\x95\x98");  // jamo -> 하
  const std::string with_nul = std::string("a\0b", 3);
  EXPECT_EQ(utf8::nfc(with_nul), with_nul);
}

}  // namespace
}  // namespace epmoe
