// The byte <-> character map of byte-level BPE (GPT-2, Qwen2, Llama 3, ...).
//
// Vocabularies of byte-level BPE models are spelled in printable characters: every byte of the
// input stands for one character (printable Latin-1 bytes for themselves, the others for
// U+0100 and up, e.g. the space byte for "Ġ"). Tokens in vocab.json / tokenizer.json are written
// in that alphabet, so we need the map to read the files and its inverse to decode.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace epmoe::byte_level {

// UTF-8 spelling of the character that stands for byte b.
std::string_view char_for_byte(uint8_t b);

// Spells raw bytes in the byte-level alphabet (the form vocabulary keys are written in).
std::string encode(std::string_view bytes);

// Inverse of encode: the raw bytes a vocabulary spelling stands for, or nullopt if it holds a
// character outside the alphabet (added tokens such as "<think>" or CJK words can).
std::optional<std::string> decode(std::string_view spelling);

}  // namespace epmoe::byte_level
