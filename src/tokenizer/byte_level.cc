#include "tokenizer/byte_level.h"

#include <array>

namespace epmoe::byte_level {
namespace {

struct Tables {
  std::array<std::string, 256> spelling;  // byte -> UTF-8 of its character
  std::array<int16_t, 512> byte_of;       // code point -> byte, -1 when not in the alphabet

  Tables() {
    byte_of.fill(-1);
    // GPT-2's bytes_to_unicode(): bytes that are printable Latin-1 characters ('!'..'~',
    // '¡'..'¬', '®'..'ÿ') stand for themselves; the remaining 68 bytes, in increasing order,
    // take the code points 256, 257, ... so that every byte gets a visible, non-space character.
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const int cp = printable(b) ? b : next++;
      byte_of[cp] = static_cast<int16_t>(b);
      std::string& s = spelling[b];
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {  // all code points here are below 0x800: two-byte UTF-8
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

std::string_view char_for_byte(uint8_t b) { return tables().spelling[b]; }

std::string encode(std::string_view bytes) {
  const Tables& t = tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += t.spelling[static_cast<uint8_t>(c)];
  return out;
}

std::optional<std::string> decode(std::string_view spelling) {
  const Tables& t = tables();
  std::string out;
  out.reserve(spelling.size());
  const auto* p = reinterpret_cast<const unsigned char*>(spelling.data());
  const size_t n = spelling.size();
  for (size_t i = 0; i < n;) {
    // Only one- and two-byte characters (code points < 0x800) can be in the alphabet.
    int cp;
    if (p[i] < 0x80) {
      cp = p[i], i += 1;
    } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < n && (p[i + 1] & 0xC0) == 0x80) {
      cp = ((p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F), i += 2;
    } else {
      return std::nullopt;
    }
    if (cp >= static_cast<int>(t.byte_of.size()) || t.byte_of[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.byte_of[cp]));
  }
  return out;
}

}  // namespace epmoe::byte_level
