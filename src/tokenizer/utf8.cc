#include "tokenizer/utf8.h"

#include <utf8proc.h>

#include <cstdlib>

#include "util/error.h"

namespace epmoe::utf8 {
namespace {

enum class SeqKind { kValid, kInvalid, kTruncated };

struct Seq {
  SeqKind kind;
  size_t len;  // valid: bytes of the character; invalid/truncated: bytes of the maximal subpart
};

// Classifies the sequence starting at p[0] (n >= 1 bytes available) following Table 3-7 of the
// Unicode Standard (well-formed UTF-8 byte sequences). The allowed range of the second byte
// depends on the lead byte; that is what rules out overlongs, surrogates and > U+10FFFF.
Seq next_sequence(const unsigned char* p, size_t n) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return {SeqKind::kValid, 1};
  size_t need;  // continuation bytes after the lead
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    need = 2;
  } else if (b0 == 0xED) {
    need = 2, hi = 0x9F;
  } else if (b0 == 0xF0) {
    need = 3, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 3;
  } else if (b0 == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    return {SeqKind::kInvalid, 1};  // continuation byte or a lead that can never be valid
  }
  for (size_t k = 1; k <= need; ++k) {
    if (k >= n) return {SeqKind::kTruncated, k};
    const unsigned char b = p[k];
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {SeqKind::kInvalid, k};
  }
  return {SeqKind::kValid, need + 1};
}

}  // namespace

bool is_valid(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t i = 0, n = bytes.size();
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    Seq s = next_sequence(p + i, n - i);
    if (s.kind != SeqKind::kValid) return false;
    i += s.len;
  }
  return true;
}

void append_lossy(std::string_view bytes, std::string& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t i = 0, n = bytes.size(), run = 0;  // [run, i) is well-formed and not yet copied
  out.reserve(out.size() + n);
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    Seq s = next_sequence(p + i, n - i);
    if (s.kind == SeqKind::kValid) {
      i += s.len;
      continue;
    }
    out.append(bytes.substr(run, i - run));
    out.append(kReplacement);
    i += s.len;
    run = i;
  }
  out.append(bytes.substr(run));
}

size_t incomplete_tail(std::string_view bytes) {
  // A sequence is at most 4 bytes, so only the last 3 bytes can start an unfinished one.
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t start = n - back;
    if ((p[start] & 0xC0) == 0x80) continue;  // continuation byte: the lead is further back
    Seq s = next_sequence(p + start, back);
    return s.kind == SeqKind::kTruncated && s.len == back ? back : 0;
  }
  return 0;
}

std::string nfc(std::string_view text) {
  bool ascii = true;
  for (char c : text) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);  // ASCII is always in NFC; skips utf8proc's two passes
  utf8proc_uint8_t* mapped = nullptr;
  // An explicit length (no UTF8PROC_NULLTERM) lets the text contain NUL characters.
  utf8proc_ssize_t len =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (len < 0) {
    throw Error(std::string("NFC normalisation failed: ") + utf8proc_errmsg(len));
  }
  std::string out(reinterpret_cast<const char*>(mapped), static_cast<size_t>(len));
  std::free(mapped);
  return out;
}

}  // namespace epmoe::utf8
