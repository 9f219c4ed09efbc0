// UTF-8 helpers for the tokenizer.
//
// Byte-level BPE tokens are arbitrary byte strings, so decoded output can be ill-formed UTF-8.
// We turn it into text the way transformers does (Python's errors="replace", Rust's
// from_utf8_lossy): each *maximal subpart* of an ill-formed sequence becomes one U+FFFD, as
// recommended by the Unicode Standard (chapter 3, "U+FFFD Substitution of Maximal Subparts").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace epmoe::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Whether `bytes` is well-formed UTF-8 (no surrogates, no overlongs, nothing above U+10FFFF).
bool is_valid(std::string_view bytes);

// Appends `bytes` to `out`, replacing each maximal ill-formed subpart with U+FFFD.
void append_lossy(std::string_view bytes, std::string& out);

inline std::string lossy(std::string_view bytes) {
  std::string out;
  append_lossy(bytes, out);
  return out;
}

// Length of the trailing part of `bytes` that is a proper prefix of a well-formed sequence (a
// character cut short that more bytes could still complete); 0 when there is none. A streaming
// decoder holds these bytes back instead of replacing them.
size_t incomplete_tail(std::string_view bytes);

// Unicode Normalization Form C of well-formed UTF-8 (through utf8proc).
std::string nfc(std::string_view text);

}  // namespace epmoe::utf8
