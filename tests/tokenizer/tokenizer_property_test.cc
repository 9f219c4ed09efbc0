// Properties that must hold for any input, on random strings from a seeded generator:
// decode(encode(s)) == NFC(s) for well-formed UTF-8, and ill-formed bytes never crash and come
// back with U+FFFD in place of each maximal ill-formed subpart.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace epmoe {
namespace {

std::string utf8_of(char32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Random text mixing the kinds of input that exercise different parts of the pipeline: the
// word regex (letters, digits, punctuation, contractions, runs of whitespace), NFC (combining
// marks, Hangul jamo), multi-byte BPE (CJK, emoji with ZWJ and skin tones) and added tokens.
class TextGenerator {
 public:
  explicit TextGenerator(uint32_t seed) : rng_(seed) {}

  std::string next(size_t max_pieces) {
    std::string s;
    const size_t n = pick(max_pieces + 1);
    for (size_t i = 0; i < n; ++i) s += piece();
    return s;
  }

 private:
  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  char32_t in(char32_t lo, char32_t hi) {
    return std::uniform_int_distribution<char32_t>(lo, hi)(rng_);
  }

  std::string piece() {
    static const char* const kWords[] = {"the",  "The",   "hello", "world", "expert", "parallel",
                                         "café", "naïve", "Ωmega", "x",     "I",      "DON"};
    static const char* const kSpaces[] = {" ",    "  ",     "\t",     "\n",     "\r\n",   "\n\n",
                                          " \n ", "\u00A0", "\u3000", "\u2028", "\u0085", "\u180E"};
    static const char* const kPunct[] = {".", ",",   "!?",  "...", "'s", "'LL", "'d", "(",
                                         ")", "{\"", "\"}", "$",   "\\", "#",   "->", "'"};
    static const char* const kAdded[] = {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_"};
    switch (pick(11)) {
      case 0:
        return kWords[pick(std::size(kWords))];
      case 1:
        return kSpaces[pick(std::size(kSpaces))];
      case 2:
        return kPunct[pick(std::size(kPunct))];
      case 3:
        return std::to_string(pick(100000));
      case 4:
        return utf8_of(in(0x21, 0x7E));  // any printable ASCII
      case 5: {  // a Latin letter with 1-2 combining marks (NFC composes many of these)
        std::string s = utf8_of(in('a', 'z'));
        for (size_t k = pick(2) + 1; k > 0; --k) s += utf8_of(in(0x300, 0x36F));
        return s;
      }
      case 6:
        return utf8_of(in(0xC0, 0x24F));  // Latin-1 and Latin Extended
      case 7:
        return utf8_of(in(0x4E00, 0x9FFF));  // CJK ideographs
      case 8:
        return utf8_of(in(0x1100, 0x1112)) + utf8_of(in(0x1161, 0x1175));  // jamo -> Hangul
      case 9: {  // emoji, sometimes with a skin tone or joined by ZWJ
        std::string s = utf8_of(in(0x1F600, 0x1F64F));
        if (pick(3) == 0) s += utf8_of(in(0x1F3FB, 0x1F3FF));
        if (pick(3) == 0) s += "\u200D" + utf8_of(in(0x1F466, 0x1F469));
        return s;
      }
      default:
        return kAdded[pick(std::size(kAdded))];
    }
  }

  std::mt19937 rng_;
};

// Random bytes biased towards the troublesome: lone continuation bytes, leads without their
// continuations, overlongs (C0/C1, E0 80), surrogates (ED A0..), bytes above F4, NUL.
std::string random_bytes(std::mt19937& rng, size_t max_len) {
  static const std::string kFragments[] = {"\x80",
                                           "\xBF",
                                           "\xC0\xAF",
                                           "\xC1",
                                           "\xC3",
                                           "\xE0\x80",
                                           "\xE2\x82",
                                           "\xED\xA0\x80",
                                           "\xF0\x9F",
                                           "\xF0\x9F\x98",
                                           "\xF4\x90\x80\x80",
                                           "\xF5",
                                           "\xFF",
                                           std::string(1, '\0'),
                                           "a",
                                           " ",
                                           "\xC3\xA9",
                                           "\xF0\x9F\x98\x80"};
  std::string s;
  const size_t n = std::uniform_int_distribution<size_t>(0, max_len)(rng);
  for (size_t i = 0; i < n; ++i) {
    if (rng() % 2) {
      s += kFragments[rng() % std::size(kFragments)];
    } else {
      s += static_cast<char>(rng() & 0xFF);
    }
  }
  return s;
}

struct Named {
  const char* name;
  const Tokenizer& tok;
};

std::vector<Named> tokenizers() {
  static const Tokenizer qwen2 = Tokenizer::load(test::qwen2_dir());
  static const Tokenizer small = Tokenizer::load(test::bpe_fixture_dir());
  return {{"qwen2", qwen2}, {"bpe-tokenizer", small}};
}

TEST(TokenizerProperty, DecodeOfEncodeIsNfcOfValidText) {
  for (const Named& t : tokenizers()) {
    TextGenerator gen(1234);
    for (int i = 0; i < 1500; ++i) {
      const std::string s = gen.next(i % 50 == 0 ? 400 : 24);
      ASSERT_TRUE(utf8::is_valid(s));
      ASSERT_EQ(t.tok.decode(t.tok.encode(s)), utf8::nfc(s)) << t.name << " on '" << s << "'";
    }
  }
}

TEST(TokenizerProperty, EncodeIsStableAcrossCacheState) {
  // The word cache must not change results: a fresh tokenizer (cold cache) and a warm one agree.
  const Tokenizer cold = Tokenizer::load(test::bpe_fixture_dir());
  const Tokenizer& warm = tokenizers()[1].tok;
  TextGenerator gen(99);
  for (int i = 0; i < 300; ++i) {
    const std::string s = gen.next(30);
    warm.encode(s);
  }
  TextGenerator again(99);
  for (int i = 0; i < 300; ++i) {
    const std::string s = again.next(30);
    ASSERT_EQ(cold.encode(s), warm.encode(s)) << s;
  }
}

TEST(TokenizerProperty, ConcurrentEncodesAgreeWithSequentialOnes) {
  // encode() shares the word cache and per-thread scratch state; threads must not disturb
  // each other. A fresh tokenizer makes the threads race to fill the cache.
  const Tokenizer tok = Tokenizer::load(test::bpe_fixture_dir());
  std::vector<std::string> texts;
  TextGenerator gen(5);
  for (int i = 0; i < 400; ++i) texts.push_back(gen.next(40));
  std::vector<std::vector<int32_t>> results[2];
  std::vector<std::thread> threads;
  for (auto& r : results) {
    threads.emplace_back([&tok, &texts, &r] {
      for (const std::string& t : texts) r.push_back(tok.encode(t));
    });
  }
  for (auto& t : threads) t.join();
  const Tokenizer reference = Tokenizer::load(test::bpe_fixture_dir());
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto expected = reference.encode(texts[i]);
    ASSERT_EQ(results[0][i], expected) << texts[i];
    ASSERT_EQ(results[1][i], expected) << texts[i];
  }
}

TEST(TokenizerProperty, IllFormedInputIsRepairedNotFatal) {
  std::mt19937 rng(42);
  for (const Named& t : tokenizers()) {
    for (int i = 0; i < 1500; ++i) {
      const std::string b = random_bytes(rng, 40);
      std::vector<int32_t> ids;
      ASSERT_NO_THROW(ids = t.tok.encode(b)) << t.name;
      const std::string text = t.tok.decode(ids);
      ASSERT_TRUE(utf8::is_valid(text));
      // Encoding repairs the input the way errors="replace" would, then tokenizes that text.
      ASSERT_EQ(text, utf8::nfc(utf8::lossy(b))) << t.name;
    }
  }
}

TEST(TokenizerProperty, DecodingArbitraryIdsGivesValidText) {
  // Random ids make arbitrary byte sequences; decode and the stream decoder must both repair
  // them, identically.
  std::mt19937 rng(7);
  for (const Named& t : tokenizers()) {
    std::uniform_int_distribution<int32_t> any_id(0, t.tok.vocab_size() - 1);
    for (int i = 0; i < 500; ++i) {
      std::vector<int32_t> ids(rng() % 20);
      for (int32_t& id : ids) id = any_id(rng);
      const std::string text = t.tok.decode(ids);
      ASSERT_TRUE(utf8::is_valid(text));
      StreamDecoder stream(t.tok);
      std::string joined;
      for (int32_t id : ids) {
        const std::string piece = stream.push(id);
        ASSERT_TRUE(utf8::is_valid(piece));
        joined += piece;
      }
      joined += stream.flush();
      ASSERT_EQ(joined, text) << t.name;
    }
  }
}

TEST(TokenizerProperty, LongRunsStayFast) {
  // One word of 200k identical letters and a 200k-space run: the merge loop and the regex must
  // stay near-linear (a quadratic loop would take minutes here).
  for (const Named& t : tokenizers()) {
    for (const std::string& s :
         {std::string(200000, 'a'), std::string(200000, ' '), std::string(100000, '\n') + "x"}) {
      EXPECT_EQ(t.tok.decode(t.tok.encode(s)), s) << t.name;
    }
  }
}

}  // namespace
}  // namespace epmoe
